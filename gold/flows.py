"""The gold flows: each one streaming query over silver, with its own watermark."""

from __future__ import annotations

from gold import activity, ads, alerts, custom_sessions, sessions, spans
from lakehouse.flows import Flow, Output, TableInput

FLOWS = (
    Flow(
        name="gold.sessions",
        description="session_window(event_time, 15 minutes) per user",
        inputs=(TableInput("silver.events"),),
        transform=sessions.sessions,
        params=lambda settings: {"watermark": settings.watermarks.events},
        outputs=(Output(sessions.TABLE, schema=sessions.SCHEMA, zorder_by=("user_id",)),),
    ),
    Flow(
        name="gold.user_activity_5m",
        description="per user 5-minute windows, update mode, upserted by (user, window)",
        inputs=(TableInput("silver.events"),),
        transform=activity.five_minute_activity,
        params=lambda settings: {"watermark": settings.watermarks.events},
        output_mode="update",
        keys=activity.FIVE_MINUTE_KEYS,
        outputs=(
            Output(
                activity.FIVE_MINUTE_TABLE,
                schema=activity.FIVE_MINUTE_SCHEMA,
                zorder_by=("user_id",),
            ),
        ),
    ),
    Flow(
        name="gold.user_activity_hourly",
        description="per user 5-minute counts chained into hourly windows, one query",
        inputs=(TableInput("silver.events"),),
        transform=activity.hourly_activity,
        params=lambda settings: {"watermark": settings.watermarks.events},
        outputs=(
            Output(activity.HOURLY_TABLE, schema=activity.HOURLY_SCHEMA, zorder_by=("user_id",)),
        ),
    ),
    Flow(
        name="gold.sessions_custom",
        description="sessions from a transformWithStateInPandas processor, chained into "
        "hourly session statistics, one query",
        inputs=(TableInput("silver.events"),),
        transform=custom_sessions.sessions_and_hourly_stats,
        params=lambda settings: {
            "watermark": settings.watermarks.events,
            "max_pages": settings.gold.session_max_pages,
            "buckets": settings.gold.session_buckets,
        },
        seed_table=lambda settings: settings.gold.sessions_seed_table,
        outputs=(
            Output(
                custom_sessions.TABLE,
                rows=custom_sessions.session_rows,
                schema=custom_sessions.SCHEMA,
                zorder_by=("user_id",),
            ),
            Output(
                custom_sessions.STATS_TABLE,
                rows=custom_sessions.stats_rows,
                schema=custom_sessions.STATS_SCHEMA,
            ),
        ),
    ),
    Flow(
        name="gold.ad_performance_hourly",
        description="per ad and hour: impressions (once each), clicks, click-through rate",
        inputs=(TableInput("silver.ad_attribution"),),
        transform=ads.ad_performance,
        params=lambda settings: {"watermark": settings.watermarks.attribution},
        outputs=(Output(ads.TABLE, schema=ads.SCHEMA, zorder_by=("ad_id",)),),
    ),
    Flow(
        name="gold.purchase_alerts",
        description="an alert per purchase that is the 3rd (or later) within 1 minute",
        inputs=(TableInput("silver.events"),),
        transform=alerts.purchase_alerts,
        params=lambda settings: {
            "ttl": settings.gold.state_ttl,
            "lateness": settings.watermarks.events,
        },
        outputs=(Output(alerts.TABLE, schema=alerts.SCHEMA, zorder_by=("user_id",)),),
        stops_itself=False,  # ProcessingTime mode (TTL): endless no-data micro-batches
    ),
    Flow(
        name="gold.user_activity_spans",
        description="per user and event type, first and last activity once idle 30 minutes "
        "(applyInPandasWithState, event-time timeout)",
        inputs=(TableInput("silver.events"),),
        transform=spans.activity_spans,
        params=lambda settings: {"watermark": settings.watermarks.events},
        outputs=(Output(spans.TABLE, schema=spans.SCHEMA, zorder_by=("user_id",)),),
    ),
)
