"""The gold flows: each one streaming query over silver, with its own watermark."""

from __future__ import annotations

from gold import activity, ads, alerts, custom_sessions, sessions, spans
from lakehouse import oracle
from lakehouse.flows import Flow, Output, Reference, TableInput

ALERT_IDENTITY = ("user_id", "event_id", "purchase_time")

FLOWS = (
    Flow(
        name="gold.sessions",
        description="session_window(event_time, 15 minutes) per user",
        inputs=(TableInput("silver.events"),),
        transform=sessions.sessions,
        params=lambda settings: {"watermark": settings.watermarks.events},
        outputs=(
            Output(
                sessions.TABLE,
                schema=sessions.SCHEMA,
                zorder_by=("user_id",),
                reference=Reference(oracle.sessions_table, ("user_id", "session_start")),
            ),
        ),
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
                reference=Reference(oracle.user_activity_5m_table, activity.FIVE_MINUTE_KEYS),
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
            Output(
                activity.HOURLY_TABLE,
                schema=activity.HOURLY_SCHEMA,
                zorder_by=("user_id",),
                reference=Reference(oracle.user_activity_hourly_table, ("user_id", "hour_start")),
            ),
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
                reference=Reference(oracle.sessions_custom_table, ("user_id", "session_start")),
            ),
            Output(
                custom_sessions.STATS_TABLE,
                rows=custom_sessions.stats_rows,
                schema=custom_sessions.STATS_SCHEMA,
                reference=Reference(oracle.session_stats_hourly_table, ("hour_start",)),
            ),
        ),
    ),
    Flow(
        name="gold.ad_performance_hourly",
        description="per ad and hour: impressions (once each), clicks, click-through rate",
        inputs=(TableInput("silver.ad_attribution"),),
        transform=ads.ad_performance,
        params=lambda settings: {"watermark": settings.watermarks.attribution},
        outputs=(
            Output(
                ads.TABLE,
                schema=ads.SCHEMA,
                zorder_by=("ad_id",),
                reference=Reference(oracle.ad_performance_hourly_table, ("ad_id", "hour_start")),
            ),
        ),
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
        outputs=(
            Output(
                alerts.TABLE,
                schema=alerts.SCHEMA,
                zorder_by=("user_id",),
                # an alert carries the figures of the moment it was raised, which depend on the
                # batches: the purchases that alert do not
                reference=Reference(
                    oracle.purchase_alerts_table,
                    ALERT_IDENTITY,
                    columns=ALERT_IDENTITY,
                    note="which purchases alert",
                ),
            ),
        ),
        stops_itself=False,  # ProcessingTime mode (TTL): endless no-data micro-batches
    ),
    Flow(
        name="gold.user_activity_spans",
        description="per user and event type, first and last activity once idle 30 minutes "
        "(applyInPandasWithState, event-time timeout)",
        inputs=(TableInput("silver.events"),),
        transform=spans.activity_spans,
        params=lambda settings: {"watermark": settings.watermarks.events},
        outputs=(
            Output(
                spans.TABLE,
                schema=spans.SCHEMA,
                zorder_by=("user_id",),
                reference=Reference(
                    oracle.user_activity_spans_table, ("user_id", "first_activity", "event_type")
                ),
            ),
        ),
    ),
)
