"""``lakehouse objectstore``: SeaweedFS's S3 server on loopback, started and stopped by the
test itself, with the put-if-absent a commit or a lock object on a bucket needs (the real
server answers; nothing stands in for it)."""

from __future__ import annotations

import os
import subprocess

import pytest

from lakehouse.cli import main
from lakehouse.s3client import Bucket, Exists, S3Error
from lakehouse.tools import objectstore
from lakehouse.tools.processes import free_port, listening

COMMIT = "tables/bronze/events/_delta_log/00000000000000000000.json"


def _exports(out: str) -> dict[str, str]:
    """What a shell has after ``eval`` of the printed lines (a real bash, an empty env)."""
    shell = subprocess.run(
        ["bash", "-c", f"{out}\nenv"],
        capture_output=True,
        text=True,
        env={"PATH": os.environ["PATH"]},
        check=True,
    )
    lines = shell.stdout.splitlines()
    return dict(line.split("=", 1) for line in lines if line.startswith(("AWS_", "LAKEHOUSE_")))


def test_the_store_serves_its_bucket_with_put_if_absent_keeps_it_and_stops(tmp_path, capsys):
    folder = tmp_path / "store"
    port = free_port()
    args = ["--root", str(tmp_path / "lake"), "--dir", str(folder), "--port", str(port)]
    args += ["--bucket", "lake-test"]
    endpoint = f"http://127.0.0.1:{port}"

    assert main(["objectstore", "start", *args]) == 0
    try:
        out, err = capsys.readouterr()
        pid = int((folder / "weed.pid").read_text())
        assert err == (
            f"objectstore: started (pid {pid}) at {endpoint}, bucket s3a://lake-test; "
            f"log {folder / 'weed.log'}\n"
        )
        access, secret = (folder / "credentials").read_text().split()
        assert (folder / "credentials").stat().st_mode & 0o777 == 0o600
        assert secret not in out + err  # the export line reads the file
        assert _exports(out) == {
            "AWS_ACCESS_KEY_ID": access,
            "AWS_SECRET_ACCESS_KEY": secret,
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_REGION": "us-east-1",
            "LAKEHOUSE_S3__PATH_STYLE": "true",
            "LAKEHOUSE_OBJECTSTORE_URI": "s3a://lake-test",
        }
        # weed's own log files in the store's folder, none in /tmp's
        assert list((folder / "logs").iterdir())

        bucket = Bucket(endpoint, "lake-test", access, secret)
        assert bucket.keys() == []
        bucket.put(COMMIT, b'{"commitInfo":{}}\n', if_absent=True)
        with pytest.raises(Exists) as second:  # the store's own 412
            bucket.put(COMMIT, b"another writer's commit\n", if_absent=True)
        assert (second.value.status, str(second.value)) == (
            412,
            f"s3://lake-test/{COMMIT} exists already",
        )
        assert bucket.get(COMMIT) == b'{"commitInfo":{}}\n'
        bucket.put("landing/events/a.json", b'{"id": 1}\n')
        assert bucket.keys() == ["landing/events/a.json", COMMIT]
        assert bucket.keys("landing/") == ["landing/events/a.json"]
        assert bucket.get("landing/events/b.json") is None

        wrong = Bucket(endpoint, "lake-test", access, "not-the-secret")
        with pytest.raises(S3Error) as refused:
            wrong.get("landing/events/a.json")
        assert refused.value.status == 403
        assert "not-the-secret" not in str(refused.value)

        assert main(["objectstore", "start", *args]) == 0
        out, err = capsys.readouterr()
        assert err.startswith(f"objectstore: already running (pid {pid}) at {endpoint}")
        assert main(["objectstore", "status", *args]) == 0
        assert capsys.readouterr().out == (
            f"objectstore: running (pid {pid}) at {endpoint}, bucket s3a://lake-test "
            f"(2 objects), data and log in {folder}\n"
        )
    finally:
        assert main(["objectstore", "stop", *args]) == 0
    assert capsys.readouterr().out == f"objectstore: stopped (pid {pid})\n"
    assert not listening("127.0.0.1", port) and not (folder / "weed.pid").exists()
    assert main(["objectstore", "status", *args]) == 1
    assert capsys.readouterr().out == f"objectstore: not running (folder {folder})\n"

    # started again on its folder: the same keys, the objects kept
    assert main(["objectstore", "start", *args]) == 0
    try:
        assert (folder / "credentials").read_text().split() == [access, secret]
        assert Bucket(endpoint, "lake-test", access, secret).get(COMMIT) == (b'{"commitInfo":{}}\n')
    finally:
        assert main(["objectstore", "stop", *args]) == 0


def test_bad_store_arguments_are_one_line(tmp_path, capsys):
    args = ["--root", str(tmp_path), "--dir", str(tmp_path / "s")]
    assert main(["objectstore", "start", *args, "--bucket", "Lake_1"]) == 2
    assert capsys.readouterr().err == (
        "lakehouse: error: bucket name 'Lake_1' cannot be used: 3 to 63 lower-case letters, "
        "digits, '-' and '.', starting and ending with a letter or digit\n"
    )
    assert main(["objectstore", "env", *args]) == 2
    assert capsys.readouterr().err == (
        f"lakehouse: error: no object store was started in {tmp_path / 's'}: "
        "`lakehouse objectstore start` first\n"
    )
    assert not (tmp_path / "s").exists()


def test_a_missing_weed_command_says_how_to_build_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(objectstore, "WEED", tmp_path / "no" / "weed")
    assert main(["objectstore", "start", "--root", str(tmp_path), "--port", str(free_port())]) == 2
    assert capsys.readouterr().err == (
        f"lakehouse: error: SeaweedFS's weed command is missing at {tmp_path / 'no' / 'weed'}: "
        "run `make setup` (it builds it once from the Go module proxy; Go 1.26 is needed)\n"
    )
