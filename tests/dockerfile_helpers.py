"""docker/Dockerfile read as the tests need it (test_docker, test_install): its instructions,
and what the final stage (the image) sets."""

from __future__ import annotations

import shlex
from pathlib import Path

DOCKERFILE = Path(__file__).resolve().parents[1] / "docker" / "Dockerfile"


def instructions() -> list[str]:
    """Every instruction, its continuation lines joined, comments left out."""
    lines, current = [], ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):  # also inside a continued instruction
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
        else:
            lines.append(current + line)
            current = ""
    return lines


def final_stage() -> list[str]:
    """The instructions of the last stage: what the image runs with."""
    lines = instructions()
    start = max(i for i, line in enumerate(lines) if line.startswith("FROM "))
    return lines[start:]


def image_env() -> dict[str, str]:
    """The image's ENV variables, in order (``ENV K=V ...`` and the old ``ENV K V``)."""
    env: dict[str, str] = {}
    for line in final_stage():
        if not line.startswith("ENV "):
            continue
        words = shlex.split(line[len("ENV ") :])
        if "=" not in words[0]:
            env[words[0]] = " ".join(words[1:])
            continue
        for word in words:
            key, _, value = word.partition("=")
            env[key] = value
    return env


def image_user() -> str | None:
    """The last USER of the image (None: it runs as root)."""
    users = [line.split()[1] for line in final_stage() if line.startswith("USER ")]
    return users[-1] if users else None


def workdir() -> str:
    """The image's work dir (the last WORKDIR)."""
    return [line.split()[1] for line in final_stage() if line.startswith("WORKDIR ")][-1]
