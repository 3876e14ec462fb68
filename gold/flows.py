"""The gold flows: each one streaming query over silver, with its own watermark."""

from __future__ import annotations

from gold import activity, sessions
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
    Flow(
        name="gold.user_activity_hourly",
        description="per user 5-minute counts chained into hourly windows, one query",
        inputs=(TableInput("silver.events"),),
        transform=activity.hourly_activity,
        params=lambda settings: {"watermark": settings.watermarks.events},
        outputs=(Output(activity.HOURLY_TABLE, schema=activity.HOURLY_SCHEMA),),
    ),
)
