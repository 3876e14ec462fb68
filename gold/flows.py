"""The gold flows: each one streaming query over silver, with its own watermark."""

from __future__ import annotations

from gold import sessions
from lakehouse.flows import Flow, Output, TableInput

FLOWS = (
    Flow(
        name="gold.sessions",
        description="session_window(event_time, 15 minutes) per user",
        inputs=(TableInput("silver.events"),),
        transform=sessions.sessions,
        params=lambda settings: {"watermark": settings.watermarks.events},
        outputs=(Output(sessions.TABLE, schema=sessions.SCHEMA),),
    ),
)
