"""The bronze flows: one per landing source, each writing its table and the shared quarantine."""

from __future__ import annotations

from functools import partial

from bronze.sources import (
    EVENT_TIME,
    QUARANTINE_SCHEMA,
    QUARANTINE_TABLE,
    SOURCES,
    bronze_rows,
    parse_lines,
    quarantine_rows,
    table_schema,
)
from lakehouse.flows import Flow, LandingInput, Output


def _flow(source: str) -> Flow:
    return Flow(
        name=f"bronze.{source}",
        description=f"landing/{source} JSON lines to bronze.{source}, bad lines to quarantine",
        inputs=(LandingInput(source),),
        transform=partial(parse_lines, source=source),
        outputs=(
            Output(
                f"bronze.{source}",
                partial(bronze_rows, source=source),
                table_schema(source),
                event_time=EVENT_TIME[source],
            ),
            Output(QUARANTINE_TABLE, partial(quarantine_rows, source=source), QUARANTINE_SCHEMA),
        ),
    )


FLOWS = tuple(_flow(source) for source in SOURCES)
