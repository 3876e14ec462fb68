"""Secrets never shown: the values of settings whose keys name a password, a secret, a JAAS
config, a token, a credential or a key (Kafka client options, ``spark_conf``) are masked in the
settings' repr, and taken out of every text the project prints or records (an error line, a row
of ops.runs, ``lakehouse status``, the report) by :func:`redact`.

Settings remember their secret values when they are built (:func:`remember`): a text that holds
one, whatever made it (a JVM's error naming a JAAS config, say), is redacted. Text recorded
before, or a secret the settings never held, is caught by its form: ``password=...`` and the like.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

MASK = "***"
# the keys whose values are secrets; a key that names a file, a type or an algorithm is not one
# (ssl.keystore.location is a path; ssl.keystore.password and ssl.keystore.key are secrets)
SECRET_KEY = re.compile(r"password|secret|jaas|token|credential|key", re.IGNORECASE)
NOT_SECRET = re.compile(r"\.(location|type|algorithm|url|ms|class|keytab)$", re.IGNORECASE)
# shorter values, numbers and true/false are not searched for in text (a spark_conf key such as
# ...requireAllClusterKeys... would otherwise mask every "true"); their form still is
MIN_KNOWN = 6
_PLAIN_VALUE = re.compile(r"^(\d+|true|false|none|null)$", re.IGNORECASE)
# a secret written as an assignment, in a JAAS config or a properties line: password="..."
_ASSIGNED = re.compile(
    r"""(?ix)
    (\b[\w.-]*(?:password|secret|token|credential)[\w.-]*\s*[=:]\s*)
    ("(?:\\.|[^"\\])*"|'[^']*'|[^\s"',;)\]}]+)
    """
)
_JAAS_VALUE = re.compile(r'(\w+)\s*=\s*("(?:\\.|[^"\\])*"|[^\s;]+)')

_known: set[str] = set()


def is_secret(key: str) -> bool:
    """Whether the value of setting or client option ``key`` is a secret."""
    return bool(SECRET_KEY.search(key)) and not NOT_SECRET.search(key)


def remember(options: Mapping[str, str]) -> None:
    """Keep the secret values of ``options`` (key: value) for :func:`redact`; a JAAS config's
    own secrets (its password="...") too, as a text may quote them alone."""
    for key, value in options.items():
        if not is_secret(key):
            continue
        values = [value]
        if "jaas" in key.lower():
            values += [v.strip('"') for k, v in _JAAS_VALUE.findall(value) if SECRET_KEY.search(k)]
        _known.update(v for v in values if len(v) >= MIN_KNOWN and not _PLAIN_VALUE.match(v))


def masked(options: Mapping[str, str]) -> dict[str, str]:
    """``options`` with the value of each secret key replaced by :data:`MASK`."""
    return {k: MASK if is_secret(k) else v for k, v in options.items()}


def redact(text: str) -> str:
    """``text`` without a secret: each value the settings hold (:func:`remember`) and each
    assignment to a key naming a password, secret, token or credential masked."""
    if not text:
        return text
    for value in sorted(_known, key=len, reverse=True):
        text = text.replace(value, MASK)

    def mask(found: re.Match) -> str:
        value = found[2]
        quote = value[0] if value[:1] in ("'", '"') else ""
        return f"{found[1]}{quote}{MASK}{quote}"

    return _ASSIGNED.sub(mask, text)
