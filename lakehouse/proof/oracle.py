"""The gold tables computed in batch with pandas, straight from the data contract
(docs/architecture.md 7), sharing nothing with the streaming transforms: the reference the
streaming results are checked against.

Each function takes the whole input table as a pandas DataFrame (timestamps as UTC-aware or
naive UTC ``datetime64``) and returns the rows a streaming run over the same input must have
written once it has caught up: a flow in append mode writes a row once the watermark has
passed its end, so the reference keeps the rows whose end the final watermark (the latest
event time minus the allowed lateness) has passed. Rows are sorted by their key.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from lakehouse.contract import EVENT_TYPES

SESSION_GAP = pd.Timedelta(minutes=15)
SPAN_IDLE = pd.Timedelta(minutes=30)
ALERT_SPAN = pd.Timedelta(minutes=1)
ALERT_THRESHOLD = 3


def _utc(column: pd.Series) -> pd.Series:
    column = pd.to_datetime(column)
    return column.dt.tz_localize("UTC") if column.dt.tz is None else column.dt.tz_convert("UTC")


def _events(events: pd.DataFrame) -> pd.DataFrame:
    """silver.events with UTC times, ordered by user, time and page (the order in which a
    session lists its pages when two events share a time)."""
    frame = events.assign(event_time=_utc(events["event_time"]))
    return frame.sort_values(["user_id", "event_time", "page"], kind="stable", ignore_index=True)


def watermark(times: pd.Series, lateness: pd.Timedelta) -> pd.Timestamp:
    """The watermark a stream ends with: its latest event time minus the allowed lateness."""
    return _utc(times).max() - lateness


def _runs(frame: pd.DataFrame, gap: pd.Timedelta) -> pd.Series:
    """A run number per row of ``frame`` (sorted by user and time): a new run starts at a new
    user or after a gap of more than ``gap``."""
    new_user = frame["user_id"].ne(frame["user_id"].shift())
    return (new_user | (frame["event_time"].diff() > gap)).cumsum()


def sessions(events: pd.DataFrame, lateness: pd.Timedelta, max_pages: int = 50) -> pd.DataFrame:
    """Every session the final watermark has closed (end = last event + 15 minutes), with
    what gold.sessions_custom adds: landing and exit page, the first ``max_pages`` pages,
    counts per event type."""
    frame = _events(events)
    closed_by = watermark(frame["event_time"], lateness)
    frame["run"] = _runs(frame, SESSION_GAP)
    purchase = frame["event_type"] == "purchase"
    frame["purchase"] = purchase.astype(np.int64)
    frame["revenue"] = frame["amount"].where(purchase, 0.0).fillna(0.0)
    grouped = frame.groupby("run", sort=True)
    out = grouped.agg(
        user_id=("user_id", "first"),
        session_start=("event_time", "min"),
        last=("event_time", "max"),
        events=("event_time", "size"),
        purchases=("purchase", "sum"),
        revenue=("revenue", "sum"),
        landing_page=("page", "first"),
        exit_page=("page", "last"),
    )
    out["pages"] = grouped["page"].apply(lambda p: list(p.iloc[:max_pages]))
    counts = frame.groupby(["run", "event_type"]).size()
    out["event_counts"] = [
        {t: int(counts[(run, t)]) for t in EVENT_TYPES if (run, t) in counts.index}
        for run in out.index
    ]
    out["session_end"] = out["last"] + SESSION_GAP
    out = out[out["session_end"] <= closed_by]
    columns = ["user_id", "session_start", "session_end", "events", "purchases", "revenue"]
    extra = ["landing_page", "exit_page", "pages", "event_counts"]
    return out[columns + extra].sort_values(["user_id", "session_start"], ignore_index=True)


def _hour(times: pd.Series) -> pd.Series:
    return times.dt.floor("h")


def sessions_custom(
    events: pd.DataFrame, lateness: pd.Timedelta, max_pages: int = 50
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """gold.sessions_custom and gold.session_stats_hourly: every session the final watermark
    has closed (as gold.sessions), and per hour of session end the statistics of the closed
    sessions ended in it (an hour the watermark has not passed yet holds those so far)."""
    found = sessions(events, lateness, max_pages)
    duration = (found["session_end"] - found["session_start"]).dt.total_seconds()
    stats = (
        found.assign(
            hour_start=_hour(found["session_end"]),
            duration=duration,
            purchasing=(found["purchases"] > 0).astype(np.int64),
        )
        .groupby("hour_start", as_index=False)
        .agg(
            sessions=("user_id", "size"),
            mean_duration_s=("duration", "mean"),
            mean_events=("events", "mean"),
            purchasing_sessions=("purchasing", "sum"),
        )
    )
    stats.insert(1, "hour_end", stats["hour_start"] + pd.Timedelta(hours=1))
    return found, stats.sort_values("hour_start", ignore_index=True)


def _purchase_counts(frame: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Per ``keys``: events, purchases, and revenue (the purchases' amounts; one without an
    amount counts 0)."""
    purchase = frame["event_type"] == "purchase"
    frame = frame.assign(
        purchase=purchase.astype(np.int64),
        revenue=frame["amount"].where(purchase, 0.0).fillna(0.0),
    )
    return frame.groupby(keys, as_index=False).agg(
        events=("event_time", "size"), purchases=("purchase", "sum"), revenue=("revenue", "sum")
    )


def user_activity_5m(events: pd.DataFrame) -> pd.DataFrame:
    """Every user's 5-minute windows (update mode: a window is written with its first event
    and holds the latest counts)."""
    frame = _events(events)
    frame["window_start"] = frame["event_time"].dt.floor("5min")
    out = _purchase_counts(frame, ["user_id", "window_start"])
    out.insert(2, "window_end", out["window_start"] + pd.Timedelta(minutes=5))
    return out.sort_values(["user_id", "window_start"], ignore_index=True)


def user_activity_hourly(events: pd.DataFrame, lateness: pd.Timedelta) -> pd.DataFrame:
    """Per user and hour closed by the final watermark: events, active 5-minute windows, mean
    and max events per active 5-minute window."""
    frame = _events(events)
    closed_by = watermark(frame["event_time"], lateness)
    five = (
        frame.assign(window=frame["event_time"].dt.floor("5min"))
        .groupby(["user_id", "window"], as_index=False)
        .size()
    )
    five["hour_start"] = _hour(five["window"])
    out = five.groupby(["user_id", "hour_start"], as_index=False).agg(
        events=("size", "sum"),
        active_5m_windows=("size", "size"),
        mean_events_per_5m=("size", "mean"),
        max_events_per_5m=("size", "max"),
    )
    out.insert(2, "hour_end", out["hour_start"] + pd.Timedelta(hours=1))
    out = out[out["hour_end"] <= closed_by]
    return out.sort_values(["user_id", "hour_start"], ignore_index=True)


def ad_performance_hourly(attribution: pd.DataFrame, lateness: pd.Timedelta) -> pd.DataFrame:
    """Per ad and hour of impression closed by the final watermark (on impression time):
    impressions (each once, whatever its clicks), clicks, click-through rate."""
    frame = attribution.assign(impression_time=_utc(attribution["impression_time"]))
    closed_by = watermark(frame["impression_time"], lateness)
    frame["hour_start"] = _hour(frame["impression_time"])
    out = frame.groupby(["ad_id", "hour_start"], as_index=False).agg(
        impressions=("impression_id", "nunique"), clicks=("click_id", "count")
    )
    out.insert(2, "hour_end", out["hour_start"] + pd.Timedelta(hours=1))
    out["click_through_rate"] = out["clicks"] / out["impressions"]
    out = out[out["hour_end"] <= closed_by]
    return out.sort_values(["ad_id", "hour_start"], ignore_index=True)


def purchase_alerts(events: pd.DataFrame) -> pd.DataFrame:
    """Each purchase that is its user's 3rd or later in the minute up to it, ``(t - 1 minute,
    t]``, with the purchases and amount in that minute. (A stream raises an alert once, with
    the figures of that moment: a purchase arriving later within the minute raises them in
    the table only when it arrived before the alert.)"""
    frame = _events(events)
    frame = frame[frame["event_type"] == "purchase"].sort_values(
        ["user_id", "event_time", "event_id"], ignore_index=True
    )
    rows = []
    for user_id, group in frame.groupby("user_id", sort=True):
        times = group["event_time"].dt.tz_convert(None).to_numpy()
        amounts = group["amount"].fillna(0.0).to_numpy()
        first = np.searchsorted(times, times - ALERT_SPAN.to_timedelta64(), side="right")
        last = np.searchsorted(times, times, side="right")
        for i in np.flatnonzero(last - first >= ALERT_THRESHOLD):
            rows.append(
                (
                    user_id,
                    group["event_id"].iloc[i],
                    group["event_time"].iloc[i],
                    int(last[i] - first[i]),
                    float(amounts[first[i] : last[i]].sum()),
                )
            )
    columns = ["user_id", "event_id", "purchase_time", "purchases_in_minute", "amount_in_minute"]
    out = pd.DataFrame(rows, columns=columns)
    return out.sort_values(["user_id", "purchase_time", "event_id"], ignore_index=True)


def user_activity_spans(events: pd.DataFrame, lateness: pd.Timedelta) -> pd.DataFrame:
    """Per span of a user's activity (events at most 30 minutes apart) that the final
    watermark has passed by more than 30 minutes after its last event, and per event type in
    it: first and last activity, events."""
    frame = _events(events)
    closed_by = watermark(frame["event_time"], lateness)
    frame["run"] = _runs(frame, SPAN_IDLE)
    frame["span_end"] = frame.groupby("run")["event_time"].transform("max") + SPAN_IDLE
    frame = frame[frame["span_end"] < closed_by]
    out = frame.groupby(["run", "user_id", "event_type"], as_index=False).agg(
        first_activity=("event_time", "min"),
        last_activity=("event_time", "max"),
        events=("event_time", "size"),
        span_end=("span_end", "first"),
    )
    out = out.drop(columns="run")
    return out.sort_values(["user_id", "first_activity", "event_type"], ignore_index=True)


def revenue_by_country_hourly(events: pd.DataFrame, lateness: pd.Timedelta) -> pd.DataFrame:
    """Per country (``unknown`` when an event names none) and hour closed by the final
    watermark: events, purchases, and revenue (the purchases' amounts; none counts 0)."""
    frame = _events(events)
    closed_by = watermark(frame["event_time"], lateness)
    frame["country"] = frame["country"].fillna("unknown")
    frame["hour_start"] = _hour(frame["event_time"])
    out = _purchase_counts(frame, ["country", "hour_start"])
    out.insert(2, "hour_end", out["hour_start"] + pd.Timedelta(hours=1))
    out = out[out["hour_end"] <= closed_by]
    return out.sort_values(["country", "hour_start"], ignore_index=True)


# ---- the reference of each gold table, as its declaration names it ------------------------


@dataclass
class Silver:
    """The silver tables the gold references are computed from, with the settings they need.
    A reference computed for two tables (sessions_custom and its hourly statistics) is
    computed once."""

    events: pd.DataFrame
    attribution: pd.DataFrame
    events_lateness: pd.Timedelta
    attribution_lateness: pd.Timedelta
    session_max_pages: int = 50
    _computed: dict = field(default_factory=dict, repr=False)

    def once(self, name: str, compute):
        if name not in self._computed:
            self._computed[name] = compute()
        return self._computed[name]


def sessions_table(silver: Silver) -> pd.DataFrame:
    return sessions(silver.events, silver.events_lateness, silver.session_max_pages).iloc[:, :6]


def _custom(silver: Silver) -> tuple[pd.DataFrame, pd.DataFrame]:
    return silver.once(
        "sessions_custom",
        lambda: sessions_custom(silver.events, silver.events_lateness, silver.session_max_pages),
    )


def sessions_custom_table(silver: Silver) -> pd.DataFrame:
    return _custom(silver)[0]


def session_stats_hourly_table(silver: Silver) -> pd.DataFrame:
    return _custom(silver)[1]


def user_activity_5m_table(silver: Silver) -> pd.DataFrame:
    return user_activity_5m(silver.events)


def user_activity_hourly_table(silver: Silver) -> pd.DataFrame:
    return user_activity_hourly(silver.events, silver.events_lateness)


def ad_performance_hourly_table(silver: Silver) -> pd.DataFrame:
    return ad_performance_hourly(silver.attribution, silver.attribution_lateness)


def purchase_alerts_table(silver: Silver) -> pd.DataFrame:
    return purchase_alerts(silver.events)


def user_activity_spans_table(silver: Silver) -> pd.DataFrame:
    return user_activity_spans(silver.events, silver.events_lateness)


def revenue_by_country_hourly_table(silver: Silver) -> pd.DataFrame:
    return revenue_by_country_hourly(silver.events, silver.events_lateness)
