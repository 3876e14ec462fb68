"""The folder ``lakehouse cluster package`` writes and spark-submit runs the layers from: the
project's code, its entry points, the log4j2 file and the jars, so that a machine needs the
project installed (for ``spark-submit`` and a Python with the dependencies), not a checkout,
and executors need nothing of the project at all.

    <folder>/lakehouse-code.zip   the packages (code and data files)  --py-files
    <folder>/jobs/<layer>.py      the entry point of a layer           the application
    <folder>/log4j2.properties    the driver's logging                 --driver-java-options
    <folder>/jars/*.jar           delta-spark and Spark's Kafka source --jars

Standard library only: the Airflow DAG file imports this module from an environment that has no
pyspark.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from lakehouse.jars import java_options
from lakehouse.settings import Settings

CODE_ZIP = "lakehouse-code.zip"


@dataclass(frozen=True)
class Dist:
    folder: Path
    code_name: str = CODE_ZIP

    @property
    def code(self) -> Path:
        return self.folder / self.code_name

    @property
    def jobs(self) -> Path:
        return self.folder / "jobs"

    def job(self, layer: str) -> Path:
        return self.jobs / f"{layer}.py"

    @property
    def log4j(self) -> Path:
        return self.folder / "log4j2.properties"

    @property
    def jars(self) -> Path:
        return self.folder / "jars"

    def jar_paths(self, names: list[str]) -> list[Path]:
        """Where the jars of these file names (``lakehouse.jars.native_jars``) are copied."""
        return [self.jars / Path(name).name for name in names]


def of_code(code: Path) -> Dist:
    """The folder of code zip ``code`` (``lakehouse cluster package --output``)."""
    return Dist(code.parent, code.name)


def scheduled(settings: Settings) -> Dist:
    """The folder the Airflow pipeline packs the project into before each run:
    ``scheduler.dist_dir``, or ``<root>/dist`` (the lake root is where every worker and executor
    looks already), absolute."""
    folder = Path(settings.scheduler.dist_dir) if settings.scheduler.dist_dir else None
    return Dist((folder or settings.root / "dist").absolute())


def driver_java_options(dist: Dist, settings: Settings) -> str:
    # (not this machine's class archive: the folder is run on others)
    return java_options(settings, dist.log4j, archive=False)
