"""``lakehouse verify`` passes on generated datasets (seeds, sizes, fault fractions) processed
with different micro-batch sizes: one landing file per trigger, ten, everything at once. With
events later than the watermark it checks the books, and they balance."""

from __future__ import annotations

import contextlib
import io

import pytest

from lakehouse import generate as gen
from lakehouse.progress import Progress
from lakehouse.runner import run_layers
from lakehouse.verify import run_verify

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    "seed, events, hours, max_files, options",
    [
        # 10-minute landing files: 9 micro-batches per flow and layer (the disorder stays within
        # half the watermark, so one file per batch still drops nothing)
        (
            31,
            900,
            1.5,
            1,
            {"duplicate_fraction": 0.05, "malformed_fraction": 0.02, "file_minutes": 10.0},
        ),
        (32, 4000, 3.0, 10, {"disorder_fraction": 0.2}),
        (33, 6000, 5.0, 0, {"duplicate_fraction": 0.0, "malformed_fraction": 0.0}),
    ],
)
def test_verify_passes_whatever_the_micro_batches(
    spark, settings, shuffle_partitions, seed, events, hours, max_files, options
):
    params = gen.params_from_settings(
        settings, events=events, hours=hours, late_fraction=0.0, seed=seed, **options
    )
    gen.generate(spark, settings.root, params, progress=lambda s: Progress(s, io.StringIO()))
    batches = settings.with_overrides({"trigger.max_files_per_trigger": max_files})
    # one file per micro-batch: silver with one shuffle partition writes one file per version,
    # so gold reads silver in arrival order (see test_gold_batch)
    with shuffle_partitions(1) if max_files == 1 else contextlib.nullcontext():
        run_layers(spark, batches, ["bronze", "silver"], out=io.StringIO())
    run_layers(spark, batches, ["gold"], out=io.StringIO())
    report = io.StringIO()
    assert run_verify(settings, report) == 0, report.getvalue()
    lines = report.getvalue().splitlines()
    assert lines[-1] == "verify: all 15 tables equal the reference"
    assert all(line.endswith("row for row") or "purchases alert" in line for line in lines[1:16])


def test_with_late_events_verify_checks_the_books(spark, settings, shuffle_partitions):
    # one landing file per micro-batch: a late line then meets a watermark already past it
    params = gen.params_from_settings(settings, events=1500, hours=1.5, late_fraction=0.02, seed=41)
    gen.generate(spark, settings.root, params, progress=lambda s: Progress(s, io.StringIO()))
    batches = settings.with_overrides({"trigger.max_files_per_trigger": 1})
    with shuffle_partitions(1):
        run_layers(spark, batches, ["bronze", "silver"], out=io.StringIO())
    run_layers(spark, settings, ["gold"], out=io.StringIO())  # gold: all at once
    report = io.StringIO()
    assert run_verify(settings, report) == 0, report.getvalue()
    lines = report.getvalue().splitlines()
    (books,) = [
        line for line in lines if line.startswith("  silver.events books: ") and "=" in line
    ]
    # late rows were dropped by the watermark, counted, and the books balance to the row
    kept, quarantined, duplicates, late = (
        int(part.split()[0].replace(",", "")) for part in books.split(" = ")[1].split(" + ")
    )
    bronze = int(books.split("books: ")[1].split()[0].replace(",", ""))
    assert late > 0, books
    assert bronze == kept + quarantined + duplicates + late
    assert all(line.startswith(("bronze.", "silver.")) and " ok " in line for line in lines[1:8])
