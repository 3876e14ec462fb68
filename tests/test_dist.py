"""What ``lakehouse cluster package`` writes for spark-submit (lakehouse.tools.dist): the code
zip, the layers' entry points, the log4j2 file and the jars, enough to run a layer with the
project installed and no checkout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

from lakehouse.cli import main
from lakehouse.jars import LOG4J_CONFIG
from lakehouse.settings import load_settings
from lakehouse.tools import dist
from lakehouse.tools.cluster import job_script

PROJECT = Path(__file__).resolve().parents[1]


def _fake_jars(folder: Path, names: list[str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_bytes(name.encode())
    return folder


def _package(tmp_path: Path, jars_dir: Path, capsys) -> tuple[int, str]:
    code = main(
        ["cluster", "package", "--profile", "test", "--conf", f"native.jars_dir={jars_dir}"]
        + ["--output", str(tmp_path / "dist" / "lakehouse-code.zip")]
    )
    return code, capsys.readouterr().out


def test_cluster_package_writes_what_spark_submit_needs(tmp_path, capsys):
    jars_dir = _fake_jars(tmp_path / "lib", ["delta-spark_4.2_2.13-4.4.0.jar", "other.jar"])
    code, out = _package(tmp_path, jars_dir, capsys)
    assert code == 0, out
    packed = dist.Dist(tmp_path / "dist")
    # the packages with their data files, no byte code
    names = zipfile.ZipFile(packed.code).namelist()
    for name in [
        "lakehouse/cli.py",
        "lakehouse/commands/params.py",
        "lakehouse/jobs/gold.py",
        "lakehouse/proof/oracle.py",  # (the gold flows' modules import it on executors)
        "lakehouse/fairscheduler.xml",
        "lakehouse/declared_tables.json",
        "silver/rules/events.toml",
        "bronze/__init__.py",
        "gold/__init__.py",
    ]:
        assert name in names, name
    assert not [n for n in names if "__pycache__" in n]
    # the entry points and the log4j2 file of the package, the jars of native.jars_dir
    for layer in ("bronze", "silver", "gold"):
        assert packed.job(layer).read_text() == job_script(layer).read_text()
    assert packed.log4j.read_text() == LOG4J_CONFIG.read_text()
    assert sorted(p.name for p in packed.jars.iterdir()) == [
        "delta-spark_4.2_2.13-4.4.0.jar",
        "other.jar",
    ]
    jars = ",".join(
        str(p) for p in packed.jar_paths(["delta-spark_4.2_2.13-4.4.0.jar", "other.jar"])
    )
    assert out.splitlines()[-1] == (
        f"submit with: spark-submit --master local[2] --py-files {packed.code} "
        # the project's log4j2 file, then the test profile's driver_java_options, one word
        f"--driver-java-options '-Dlog4j2.configurationFile=file:{packed.log4j} "
        f"-XX:TieredStopAtLevel=1' --jars {jars} "
        f"{packed.jobs}/<layer>.py --root <lake root>"
    )

    # again, after the project dropped a jar: the same jar is not copied twice, the dropped
    # one is gone (the folder's *.jar is the classpath)
    kept = packed.jars / "delta-spark_4.2_2.13-4.4.0.jar"
    before = kept.stat().st_ino
    (jars_dir / "other.jar").unlink()
    assert _package(tmp_path, jars_dir, capsys)[0] == 0
    assert [p.name for p in packed.jars.iterdir()] == [kept.name]
    assert kept.stat().st_ino == before
    assert sorted(p.name for p in packed.folder.iterdir()) == [
        "jars",
        "jobs",
        "lakehouse-code.zip",
        "log4j2.properties",
    ]  # no partial file left behind


def test_a_layer_entry_point_runs_from_the_zip_alone(tmp_path, capsys):
    """The entry point imports the project from the zip (as spark-submit's driver does with
    --py-files), not from a checkout, and its folder does not shadow the layer packages."""
    jars_dir = _fake_jars(tmp_path / "lib", ["a.jar"])
    assert _package(tmp_path, jars_dir, capsys)[0] == 0
    packed = dist.Dist(tmp_path / "dist")
    env = {**os.environ, "PYTHONPATH": str(packed.code)}
    usage = subprocess.run(
        [sys.executable, str(packed.job("gold")), "--help"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert usage.returncode == 0, usage.stderr
    assert usage.stdout.startswith("usage: lakehouse run ")
    # from the zip, the fair scheduler's pools (a file Spark opens) are a copy outside it
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import json, lakehouse, bronze; from lakehouse.session import session_conf; "
            "from lakehouse.settings import load_settings; "
            "conf = session_conf(load_settings('test'), submitted=True); "
            "print(json.dumps([lakehouse.__file__, bronze.__file__, "
            "conf['spark.scheduler.allocation.file']]))",
        ],
        env={**env, "LAKEHOUSE_CONFIG": str(PROJECT / "conf" / "lakehouse.toml")},
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert probe.returncode == 0, probe.stderr
    lakehouse_file, bronze_file, pools = json.loads(probe.stdout)
    assert lakehouse_file.startswith(str(packed.code)) and bronze_file.startswith(str(packed.code))
    assert pools.startswith("file:/") and not pools.startswith(f"file://{packed.code}")
    copy = Path(pools.removeprefix("file://"))
    assert copy.read_bytes() == (PROJECT / "lakehouse" / "fairscheduler.xml").read_bytes()


def test_a_layer_submitted_from_the_package_runs_on_spark_submits_master(tmp_path, capsys):
    """spark-submit of a layer as the Airflow DAG submits it: the packed folder only (zip, entry
    point, log4j2 file, jars), from a folder that is not the checkout. The job runs on
    spark-submit's master (an Airflow connection's), not the profile's (local[2]), and logs no
    INFO line. On an empty lake the gold layer stops at its missing input, exit code 2."""
    settings = load_settings("test", overrides={"root": str(tmp_path / "lake")})
    main(["cluster", "package", "--profile", "test", "--output", str(tmp_path / "dist" / "x.zip")])
    capsys.readouterr()
    packed = dist.of_code(tmp_path / "dist" / "x.zip")
    jars = ",".join(str(p) for p in sorted(packed.jars.glob("*.jar")))
    assert "delta-spark_4.2_2.13" in jars  # from jars/lib (make setup)
    events = tmp_path / "events"
    events.mkdir()
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    env["LAKEHOUSE_CONFIG"] = str(PROJECT / "conf" / "lakehouse.toml")
    env.pop("PYTHONPATH", None)
    result = subprocess.run(
        [
            str(Path(sys.executable).with_name("spark-submit")),
            "--master", "local[1]",
            "--conf", f"spark.driver.extraJavaOptions={dist.driver_java_options(packed, settings)}",
            "--conf", "spark.eventLog.enabled=true",
            "--conf", f"spark.eventLog.dir={events.as_uri()}",
            "--conf", "spark.eventLog.compress=false",
            "--py-files", str(packed.code),
            "--jars", jars,
            "--name", "lakehouse-gold",
            str(packed.job("gold")),
            "--root", str(settings.root), "--profile", "test", "--trigger", "available-now",
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 2, output[-3000:]
    table = settings.root / "tables" / "silver" / "ad_attribution"
    assert (
        f"lakehouse: error: input table silver.ad_attribution does not exist at {table}" in output
    )
    assert [line for line in output.splitlines() if " INFO " in line] == []
    (log,) = events.iterdir()  # Spark 4.2's rolling event log: a folder of events_* files
    lines = [
        line for part in sorted(log.glob("events_*")) for line in part.read_text().splitlines()
    ]
    environment = next(
        e for e in map(json.loads, lines) if e["Event"] == "SparkListenerEnvironmentUpdate"
    )
    properties = dict(environment["Spark Properties"])
    assert properties["spark.master"] == "local[1]"
    assert properties["spark.app.name"] == "lakehouse-gold"
