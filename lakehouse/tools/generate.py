"""Synthetic landing data for the three sources of the contract (docs/architecture.md 7).

The records come from dbldatagen specs built on Spark; the faults (resent duplicates, disorder
within the allowed lateness, events later than the watermark, malformed lines) are injected with a
seeded NumPy generator; lines are then written as JSON-lines files under ``landing/<source>/``,
one file per slice of arrival time, named so that lexical order is arrival order. Every injected
fault is counted in ``landing/_manifest.json`` so tests and ``verify`` can account for each line.

Shape of the data, a shop's traffic (``lakehouse generate`` prints its profile):

- sessions, not events, are drawn: each user can start a session once per slot of 3 hours
  (at the same second of each slot), and takes a slot with a chance that falls with the
  user's rank (a few heavy users come back every slot, most users rarely) times a daily
  curve (night trough, evening peak); so one user's sessions are hours apart;
- a session has a log-normal number of events (median 10, a tail up to 300) a log-normal
  time apart (median 30 s, at most 14 minutes): median minutes long, the longest hours;
- a funnel: page views (landing on the home page, a category or a product; popular and rare
  products), searches and add-to-carts; 3.5 % of sessions of 4 or more events end in a
  checkout, an add-to-cart and then 1 to 4 purchases a few seconds apart; purchase amounts
  are log-normal;
- an ad is shown on 55 % of the page views (an impression of that user at that moment), over
  many ads (skewed popularity) grouped five per campaign; each ad has a click-through rate of
  1 to 6 percent; clicks follow their impression by up to an hour, and about 5 percent of
  clicks come 1 to 2 hours later (they must not join).

All draws are hashes of the session's user and slot and the event's place in it, with the
seed: the same seed gives the same records however Spark partitions them.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from lakehouse.contract import MANIFEST, REQUIRED, SOURCES
from lakehouse.errors import LakehouseError
from lakehouse.progress import Progress
from lakehouse.settings import Settings, duration_seconds

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

# Required fields whose JSON type is checked (a string field accepts any JSON scalar).
TYPED_REQUIRED = {
    "events": ("user_id", "event_time"),
    "impressions": ("ad_id", "campaign_id", "user_id", "impression_time"),
    "clicks": ("ad_id", "user_id", "click_time"),
}
# Fault kinds, in manifest order. The malformed kinds are the corruptions of a line;
# QUARANTINED are the ones bronze must send to bronze.quarantine (an unknown extra field is kept,
# with the field in the rescued-data column).
MALFORMED = ("malformed_json", "missing_field", "wrong_type", "unknown_field", "empty_line")
# invalid: a well-formed record that breaks one of silver's drop rules (bronze keeps it, silver
# quarantines it), off unless --invalid-fraction says so
FAULTS = ("duplicate", "disorder", "late", *MALFORMED, "invalid")
QUARANTINED = ("malformed_json", "missing_field", "wrong_type", "empty_line")
_KIND = {name: code for code, name in enumerate(("none", *FAULTS))}

DEFAULT_START = "2026-01-05T08:00:00Z"
IMPRESSIONS_PER_EVENT = 0.4
SPEC_PARTITIONS = 4  # fixed, so the same seed gives the same rows on any machine
FOLLOW_CHUNK_S = 60.0  # session starts built at once by follow()
# Session starts before a follow run begins whose later events it sends (0.5 % of a session's
# events come more than 2 hours after its start)
FOLLOW_WARMUP_S = 2 * 3600
# the warm-up is built this many events at a time (those before the start dropped), so that
# the driver never collects millions of lines at once
FOLLOW_BUILD_MAX_EVENTS = 1_000_000
FOLLOW_JITTER_S = 300  # a smaller jitter of session starts: fewer candidates per minute built


class GenerateError(LakehouseError, ValueError):
    """Bad generator arguments or an unusable landing folder."""


@dataclass(frozen=True)
class GenerateParams:
    """What to generate. Fractions are shares of each source's records."""

    events: int = 100_000
    seed: int = 42
    start: str | None = None  # None: DEFAULT_START, or after the previous run of the lake
    hours: float = 24.0  # span of session starts (a day: its curve); the last sessions run on
    file_minutes: float = 5.0  # arrival time covered by one landing file
    users: int = 0  # 0: one user per 100 events (at least 50)
    duplicate_fraction: float = 0.02
    disorder_fraction: float = 0.05
    late_fraction: float = 0.002
    malformed_fraction: float = 0.005
    invalid_fraction: float = 0.0  # well-formed records that break a rule of silver's
    # sessions of 4 or more events that end in a checkout (1 to 4 purchases)
    conversion: float = 0.035
    watermarks: dict[str, str] = field(
        default_factory=lambda: {
            "events": "10 minutes",
            "impressions": "2 hours",
            "clicks": "3 hours",
        }
    )

    def validate(self) -> GenerateParams:
        if self.seed < 0:
            raise GenerateError(f"--seed must be 0 or more; got {self.seed}")
        for name in ("hours", "file_minutes"):
            if not math.isfinite(getattr(self, name)):
                raise GenerateError(f"--{name.replace('_', '-')} must be a finite number")
        if self.file_minutes * 60_000 < 1000:
            raise GenerateError(
                f"--file-minutes must cover at least a second; got {self.file_minutes}"
            )
        if self.events < 0:
            raise GenerateError(f"--events must be 0 or more; got {self.events}")
        if self.users < 0:
            raise GenerateError(f"--users must be 0 (automatic) or more; got {self.users}")
        if not self.hours > 0:
            raise GenerateError(f"--hours must be more than 0; got {self.hours}")
        if not self.file_minutes > 0:
            raise GenerateError(f"--file-minutes must be more than 0; got {self.file_minutes}")
        for name in ("duplicate", "disorder", "late", "malformed", "invalid"):
            value = getattr(self, f"{name}_fraction")
            if not 0 <= value < 1:
                raise GenerateError(f"--{name}-fraction must be in [0, 1); got {value}")
        if not 0 <= self.conversion <= 1:
            raise GenerateError(f"--conversion must be in [0, 1]; got {self.conversion}")
        total = self.disorder_fraction + self.late_fraction + self.malformed_fraction
        if total >= 1:
            raise GenerateError(
                "--disorder-fraction + --late-fraction + --malformed-fraction must stay below 1 "
                f"(each record gets at most one of them); got {total:g}"
            )
        if self.start is not None:
            parse_start(self.start)
        return self

    @property
    def start_ms(self) -> int:
        return int(parse_start(self.start or DEFAULT_START).timestamp() * 1000)

    @property
    def user_count(self) -> int:
        return self.users or default_users(self.events, self.hours)

    def watermark_ms(self, source: str) -> int:
        return duration_seconds(self.watermarks[source]) * 1000


def parse_start(text: str) -> dt.datetime:
    try:
        value = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise GenerateError(
            f"--start must be an ISO-8601 time such as {DEFAULT_START}; got {text!r}"
        ) from None
    return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)


def params_from_settings(settings: Settings, **kwargs: Any) -> GenerateParams:
    """Generator parameters whose lateness follows the configured watermarks."""
    watermarks = dataclasses.asdict(settings.watermarks)
    return GenerateParams(watermarks=watermarks, **kwargs).validate()


# --------------------------------------------------------------------------------------------
# dbldatagen specs


def _unit(column: str, salt: int) -> str:
    """A uniform number in [0, 1) that is a pure function of ``column`` (a hash, not a draw)."""
    return f"(pmod(xxhash64({column}, {salt}), 1000003) / 1000003.0)"


# dbldatagen 0.4 sets Spark 3's deprecated "spark.sql.execution.arrow.enabled" on any Spark not
# 3.x, which Spark logs as a deprecation warning then and at every later query of the session
# (127 lines in a demo). The session sets the current key
# (spark.sql.execution.arrow.pyspark.enabled) already.
DEPRECATED_ARROW = "spark.sql.execution.arrow.enabled"


def _data_generator(spark: SparkSession, **options):
    """A dbldatagen DataGenerator, without the deprecated setting it leaves on the session (and
    without the warning of its setting it)."""
    import dbldatagen as dg

    from lakehouse.session import spark_log_at

    with spark_log_at(spark, "ERROR"):
        try:
            return dg.DataGenerator(spark, **options)
        finally:
            spark.conf.unset(DEPRECATED_ARROW)


# ---- the shape of the traffic (see the module docstring) ------------------------------------

# a user's sessions start in slots of this length (each slot holds one session or none), so
# one user's sessions are hours apart; shorter when a small run needs more slots
SESSION_PERIOD_S = 3 * 3600
# events per session: log-normal (median 10, mean about 15), at most SESSION_EVENTS_MAX
SESSION_EVENTS_MEDIAN = 10
SESSION_EVENTS_SIGMA = 0.9
SESSION_EVENTS_MAX = 300
MEAN_SESSION_EVENTS = 15.0  # of the distribution above (numerically: 14.99)
# seconds between a session's events: log-normal (median 30 s), below the 15-minute session gap
GAP_MEDIAN_S = 30.0
GAP_SIGMA = 1.0
GAP_MAX_S = 14 * 60
# a session of 4 or more events ends in a checkout with this chance: an add-to-cart, then 1 to 4
# purchases a few seconds apart (several items bought at once: 3 or 4 raise a purchase alert)
CONVERSION = 0.035
BUYS = ((0.72, 1), (0.86, 2), (0.95, 3), (1.0, 4))  # (cumulative share, purchases)
# relative traffic per hour of the day (UTC): a night trough and an evening peak
DAILY_CURVE = (
    0.30, 0.20, 0.14, 0.11, 0.11, 0.14, 0.24, 0.40, 0.55, 0.64, 0.70, 0.74,
    0.80, 0.78, 0.74, 0.74, 0.80, 0.88, 0.95, 1.00, 1.00, 0.90, 0.70, 0.46,
)  # fmt: skip
# activity per user ~ 1 / rank^USER_SKEW: a few users come back every slot, most rarely
USER_SKEW = 1.0
# users per session slot taken: the default number of users gives each slot this chance on
# average (user 1 takes every one of its slots, the lightest users few)
ACTIVE_SHARE = 0.2
AD_SHARE = 0.55  # page views that show an ad (an impression)
PRODUCTS, CATEGORIES = 2000, 30


def _hash_unit(*columns: str, salt: int) -> str:
    """A uniform number in (0, 1], a pure function of ``columns`` and ``salt``."""
    return f"((pmod(xxhash64({', '.join(columns)}, {salt}), 1000003) + 1) / 1000004D)"


def _hash_normal(*columns: str, salt: int) -> str:
    """A standard normal number, a pure function of ``columns`` and ``salt`` (Box-Muller)."""
    u1, u2 = _hash_unit(*columns, salt=salt), _hash_unit(*columns, salt=salt + 1)
    return f"(sqrt(-2 * ln({u1})) * cos(2 * pi() * {u2}))"


@dataclass(frozen=True)
class Traffic:
    """Where and how much traffic one build makes: sessions starting in [start, start + span),
    their users, and the events wanted (the sessions are cut to exactly that many)."""

    events: int
    start_ms: int
    span_ms: int
    users: int
    seed: int
    tag: str
    daily: bool = True  # the daily curve; False: a flat rate (the live --follow stream)
    keep_from_ms: int | None = None  # events before this time are dropped (follow's warm-up)
    # a session starts up to this long after its slot's second (None: a quarter of the slot)
    jitter_s: int | None = None
    conversion: float = CONVERSION

    @property
    def sessions(self) -> int:
        return max(1, math.ceil(self.events / MEAN_SESSION_EVENTS))

    @property
    def period_s(self) -> int:
        """A user's slot length in seconds: SESSION_PERIOD_S, or shorter so that the users
        have at least twice the slots the sessions need."""
        slots = 2 * self.sessions / max(1, self.users)
        return int(max(60, min(SESSION_PERIOD_S, self.span_ms / 1000 / slots)))

    def curve(self) -> np.ndarray:
        return np.asarray(DAILY_CURVE if self.daily else (1.0,) * 24) / max(DAILY_CURVE)

    def activity(self, oversample: float) -> float:
        """``c`` of a user's chance to take a slot, min(1, c / rank^USER_SKEW): enough for
        ``oversample`` times the sessions wanted, on average over the curve."""
        ranks = np.arange(1, self.users + 1, dtype=np.float64) ** -USER_SKEW
        hours = (self.start_ms + np.arange(0, self.span_ms, 60_000)) // 3_600_000 % 24
        slots = self.span_ms / 1000 / self.period_s * float(self.curve()[hours].mean())
        wanted = oversample * self.sessions
        low, high = 0.0, 1.0
        while np.minimum(1.0, high * ranks).sum() * slots < wanted and high < 1e12:
            high *= 2
        for _ in range(60):
            mid = (low + high) / 2
            low, high = (
                (mid, high) if np.minimum(1.0, mid * ranks).sum() * slots < wanted else (low, mid)
            )
        return high

    @property
    def jitter(self) -> int:
        return self.period_s // 4 if self.jitter_s is None else min(self.jitter_s, self.period_s)

    def candidates(self) -> tuple[list[tuple[int, int, int]], int, int]:
        """The (slot, first second, end second) ranges of the slot seconds whose sessions can
        start in the span, the users per second of the period (``per``) and the multiplier
        giving a user's second.

        User u's sessions can start at ``slot * period + second(u)`` plus a jitter of up to
        ``jitter`` seconds, ``second(u) = ((u - 1) * K + offset) mod period`` (K coprime with
        the period, so users near each other in rank, the heavy ones, start apart): the users
        whose second lies in a range are listed directly, without going through every user
        (the live stream builds a minute at a time)."""
        period_ms = self.period_s * 1000
        begin, end = self.start_ms - self.jitter * 1000, self.start_ms + self.span_ms
        ranges = []
        for slot in range(begin // period_ms, (end - 1) // period_ms + 1):
            lo = max(0, -(-(begin - slot * period_ms) // 1000))
            hi = min(self.period_s, -(-(end - slot * period_ms) // 1000))
            if hi > lo:
                ranges.append((slot, lo, hi))
        per = -(-self.users // self.period_s)
        k = next(
            k
            for k in range(int(self.period_s * 0.618) | 1, 10 * self.period_s + 3)
            if math.gcd(k, self.period_s) == 1
        )
        return ranges, per, k


def default_users(events: int, hours: float) -> int:
    """Users for ``events`` over ``hours`` when none are given: each session slot of a user
    taken with ACTIVE_SHARE's chance on average (at least 50)."""
    sessions = events / MEAN_SESSION_EVENTS
    slots = max(1.0, hours * 3600 / SESSION_PERIOD_S)
    return max(50, math.ceil(sessions / (slots * ACTIVE_SHARE)))


def sessions_spec(spark: SparkSession, traffic: Traffic, activity: float):
    """dbldatagen: one row per (slot, second of the period, user of that second), kept when the
    user takes the slot (its chance, times the daily curve at that hour), with the session's
    start, length in events, checkout, device and country."""
    from pyspark.sql import functions as F

    t, seed = traffic, traffic.seed
    ranges, per, k = t.candidates()
    sizes = [hi - lo for _, lo, hi in ranges]
    cum = np.cumsum([0, *sizes])
    period = t.period_s
    inverse = pow(k, -1, period) if period > 1 else 0
    offset = seed * 7919 % period  # second(u) = ((u - 1) * k + offset) mod period
    curve = ", ".join(f"{v:.4f}" for v in t.curve())
    starts = ", ".join(str(c) for c in cum[:-1])
    slot_of = ", ".join(str(slot) for slot, _, _ in ranges)
    first_second = ", ".join(str(lo) for _, lo, _ in ranges)
    # row id -> range i (by the cumulative sizes), second, j-th user of that second
    rng = f"size(filter(array({starts}), c -> c <= id div {per}))"
    second = f"element_at(array({first_second}), r) + g div {per} - element_at(array({starts}), r)"
    hour = "cast(pmod(start_ms, 86400000) div 3600000 as int)"
    buys = " ".join(
        f"WHEN {_hash_unit('user_id', 'slot', salt=seed + 26)} <= {share} THEN {n}"
        for share, n in BUYS
    )
    length = _hash_normal("user_id", "slot", salt=seed + 24)
    rows = (
        _data_generator(
            spark,
            name="sessions",
            rows=max(1, int(cum[-1]) * per),
            partitions=SPEC_PARTITIONS,
            randomSeed=seed,
            randomSeedMethod="hash_fieldname",
        )
        .withColumn("g", "long", baseColumn="id", expr="id")
        .withColumn("r", "int", baseColumn="id", expr=rng if ranges else "1")
        .build()
    )
    if not ranges:
        return rows.where("false").select(F.lit(0).alias("user_id"))
    return (
        rows.withColumn("second", F.expr(second))
        .withColumn("slot", F.expr(f"cast(element_at(array({slot_of}), r) as bigint)"))
        .withColumn(
            "user_id",
            F.expr(f"pmod((second - {offset}) * {inverse}, {period}) + (g % {per}) * {period} + 1"),
        )
        .where(F.col("user_id") <= t.users)
        .withColumn(
            "start_ms",
            F.expr(
                f"slot * {period * 1000} + second * 1000 + cast("
                f"{_hash_unit('user_id', 'slot', salt=seed + 22)} * {t.jitter * 1000} as bigint)"
            ),
        )
        .where(F.expr(f"start_ms >= {t.start_ms} AND start_ms < {t.start_ms + t.span_ms}"))
        .where(
            F.expr(
                f"{_hash_unit('user_id', 'slot', salt=seed + 23)} <= least(1.0, {activity}"
                f" * pow(user_id, {-USER_SKEW})) * element_at(array({curve}), {hour} + 1)"
            )
        )
        .select(
            "user_id",
            "slot",
            "start_ms",
            F.expr(
                f"cast(least({SESSION_EVENTS_MAX}, greatest(1, round(exp("
                f"{math.log(SESSION_EVENTS_MEDIAN)} + {SESSION_EVENTS_SIGMA} * {length}))))"
                " as int)"
            ).alias("events"),
            F.expr(f"{_hash_unit('user_id', 'slot', salt=seed + 25)} < {t.conversion}").alias(
                "converts"
            ),
            F.expr(f"CASE {buys} END").alias("buys"),
            F.expr(f"xxhash64(user_id, slot, {seed + 27})").alias("order"),
        )
    )


def _cut(sessions, events: int):
    """The sessions in a random order (by hash) until ``events`` events, the last one cut
    short: a pandas frame with ``kept`` events per session; None when there are too few."""
    frame = sessions.toPandas().sort_values(["order", "user_id", "slot"], ignore_index=True)
    before = frame["events"].cumsum() - frame["events"]
    if len(frame) == 0 or before.iloc[-1] + frame["events"].iloc[-1] < events:
        return None
    frame = frame[before < events].copy()
    frame["kept"] = np.minimum(frame["events"], events - before[frame.index]).astype("int32")
    return frame


def events_frame(spark: SparkSession, traffic: Traffic) -> DataFrame:
    """The events of ``traffic``: its sessions exploded into their events (a funnel of page
    views, searches and add-to-carts, a checkout at the end of a converting session)."""
    from pyspark.sql import functions as F

    t = traffic
    sessions = _sessions(spark, t)
    if sessions is None:
        return None
    events = _event_columns(_session_events(sessions, t.seed), t)
    keep = F.lit(True) if t.keep_from_ms is None else F.unix_millis("event_time") >= t.keep_from_ms
    return events.where(keep)


_SESSION_COLUMNS = ["user_id", "slot", "start_ms", "events", "kept", "converts", "buys"]


def _sessions(spark: SparkSession, t: Traffic) -> DataFrame | None:
    """The sessions of ``t`` that make its events (sampled more widely until enough are
    found); None when it has no events."""
    sessions = None
    for oversample in (1.3, 2.0, 4.0, 16.0):
        sessions = _cut(sessions_spec(spark, t, t.activity(oversample)), t.events)
        if sessions is not None or t.events == 0:
            break
    if sessions is None or t.events == 0:
        if t.events:
            raise GenerateError(
                f"{t.users} users cannot make {t.events:,} events in {t.span_ms / 3_600_000:g} "
                "hours; give more --users or --hours"
            )
        return None
    frame = spark.createDataFrame(sessions[_SESSION_COLUMNS])
    return frame.repartition(SPEC_PARTITIONS, "user_id")


def _session_events(frame: DataFrame, seed: int) -> DataFrame:
    """Each session's events: their position, whether they buy or cart, and their times
    (log-normal gaps; a few seconds between the purchases of a checkout)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    columns = _SESSION_COLUMNS
    pos, buys = F.col("pos"), F.col("buys")
    unit = lambda salt: _hash_unit("user_id", "slot", "pos", salt=seed + salt)  # noqa: E731
    gap = (
        f"cast(least({GAP_MAX_S * 1000}, greatest(1000, round(exp({math.log(GAP_MEDIAN_S * 1000)}"
        f" + {GAP_SIGMA} * {_hash_normal('user_id', 'slot', 'pos', salt=seed + 31)})))) as bigint)"
    )
    buying = F.col("converts") & (F.col("events") >= 4) & (pos >= F.col("events") - buys)
    carting = F.col("converts") & (F.col("events") >= 4) & (pos == F.col("events") - buys - 1)
    return (
        frame.select(
            *columns[:-2],
            "converts",
            "buys",
            F.explode(F.sequence(F.lit(0), F.col("kept") - 1)).alias("pos"),
        )
        .withColumn("buying", buying)
        .withColumn("carting", carting)
        .withColumn(
            "gap_ms",
            F.when(pos == 0, F.lit(0))
            .when(F.col("buying"), F.expr(f"3000 + cast({unit(32)} * 9000 as bigint)"))
            .otherwise(F.expr(gap)),
        )
        .withColumn(
            "event_ms",
            F.col("start_ms")
            + F.sum("gap_ms").over(Window.partitionBy("user_id", "slot").orderBy("pos")),
        )
    )


def _event_columns(events: DataFrame, t: Traffic) -> DataFrame:
    """The events' landing fields: id, type, page, amount, time, device and country."""
    from pyspark.sql import functions as F

    seed = t.seed
    unit = lambda salt: _hash_unit("user_id", "slot", "pos", salt=seed + salt)  # noqa: E731
    browse = unit(33)
    page_pick, item = unit(34), unit(35)
    product = f"concat('/product/', 1 + cast(floor({PRODUCTS} * pow({item}, 3)) as int))"
    category = f"concat('/category/', 1 + cast(floor({CATEGORIES} * pow({item}, 2)) as int))"
    landing = f"CASE WHEN {page_pick} < 0.35 THEN '/' WHEN {page_pick} < 0.6 THEN {category} ELSE {product} END"
    viewing = f"CASE WHEN {page_pick} < 0.08 THEN '/' WHEN {page_pick} < 0.35 THEN {category} ELSE {product} END"
    return events.select(
        F.expr(f"md5(concat('e:{t.tag}:', user_id, ':', slot, ':', pos))").alias("event_id"),
        "user_id",
        F.expr(
            "CASE WHEN buying THEN 'purchase' WHEN carting THEN 'add_to_cart'"
            f" WHEN pos = 0 OR {browse} < 0.70 THEN 'page_view'"
            f" WHEN {browse} < 0.88 THEN 'search' ELSE 'add_to_cart' END"
        ).alias("event_type"),
        "pos",
        "event_ms",
        "slot",
    ).select(
        "event_id",
        "user_id",
        "event_type",
        F.expr(
            "CASE event_type WHEN 'search' THEN '/search' WHEN 'add_to_cart' THEN '/cart'"
            f" WHEN 'purchase' THEN '/checkout/complete'"
            f" ELSE CASE WHEN pos = 0 THEN {landing} ELSE {viewing} END END"
        ).alias("page"),
        F.expr(
            f"CASE WHEN event_type = 'purchase' THEN round(least(5000, exp(3.2 + 0.9 * "
            f"{_hash_normal('user_id', 'slot', 'pos', salt=seed + 36)})), 2) END"
        ).alias("amount"),
        F.timestamp_millis("event_ms").alias("event_time"),
        F.expr(
            f"CASE WHEN {_hash_unit('user_id', 'slot', salt=seed + 4)} < 0.55 THEN 'mobile'"
            f" WHEN {_hash_unit('user_id', 'slot', salt=seed + 4)} < 0.93 THEN 'desktop'"
            " ELSE 'tablet' END"
        ).alias("device"),
        F.expr(
            "element_at(array('US','US','US','DE','GB','FR','IN','BR','JP','NL'), "
            f"1 + cast(pmod(xxhash64(user_id, {seed + 5}), 10) as int))"
        ).alias("country"),
    )


def impressions_frame(events: DataFrame, traffic: Traffic) -> DataFrame:
    """An ad shown on AD_SHARE of the page views (skewed popularity over many ads, five ads per
    campaign), each with whether it was clicked (1 to 6 percent click-through per ad) and how
    long after."""
    from pyspark.sql import functions as F

    seed, rows = traffic.seed, round(traffic.events * IMPRESSIONS_PER_EVENT)
    ads = max(20, rows // 800)
    unit = lambda salt: _hash_unit("event_id", salt=seed + salt)  # noqa: E731
    return (
        events.where(F.expr(f"event_type = 'page_view' AND {unit(11)} < {AD_SHARE}"))
        .select(
            F.expr(f"md5(concat('i:{traffic.tag}:', event_id))").alias("impression_id"),
            F.expr(f"1 + cast(floor({ads} * pow({unit(12)}, 1.6)) as bigint)").alias("ad_id"),
            "user_id",
            F.expr(
                f"timestamp_millis(unix_millis(event_time) + 200 + cast({unit(13)} * 2800 as bigint))"
            ).alias("impression_time"),
            F.expr(unit(14)).alias("click_pick"),
            F.expr(unit(15)).alias("delay_pick"),
            F.expr(unit(16)).alias("late_pick"),
        )
        .withColumn("campaign_id", F.expr("1 + (ad_id - 1) div 5"))
        .withColumn("clicked", F.expr(f"click_pick < 0.01 + 0.05 * {_unit('ad_id', seed + 8)}"))
        # milliseconds from impression to click: up to the 1-hour bound, or 5% beyond it
        .withColumn(
            "click_delay_ms",
            F.expr(
                "CASE WHEN late_pick < 0.05 THEN 3600001 + cast(delay_pick * 3599999 as bigint)"
                " ELSE greatest(1000, least(3600000, cast(-ln(1 - delay_pick) * 480000 as bigint)))"
                " END"
            ),
        )
    )


def _lines(
    df: DataFrame, time_field: str, fields: list[str], extra: tuple[str, ...] = ()
) -> tuple[np.ndarray, list[str], dict[str, np.ndarray]]:
    """(event time in epoch ms, JSON line) of every row, ordered by time and then by the row's
    id (the first field), so a seed gives the same order however Spark partitioned the rows;
    and the ``extra`` columns in that order."""
    from pyspark.sql import functions as F

    table = df.select(
        F.unix_millis(F.col(time_field)).alias("t"),
        F.col(fields[0]).alias("id"),
        F.to_json(F.struct(*fields)).alias("line"),
        *extra,
    ).toArrow()
    t = table.column("t").to_numpy()
    order = np.lexsort((np.asarray(table.column("id").to_pylist(), dtype=object), t))
    lines = table.column("line").to_pylist()
    more = {name: table.column(name).to_numpy(zero_copy_only=False)[order] for name in extra}
    return t[order], [lines[i] for i in order], more


EVENT_FIELDS = [
    "event_id",
    "user_id",
    "event_type",
    "page",
    "amount",
    "event_time",
    "device",
    "country",
]


def source_records(
    spark: SparkSession, traffic: Traffic
) -> tuple[dict[str, tuple[np.ndarray, list[str]]], dict[str, Any]]:
    """The clean records of every source, (event time ms, JSON line) per source, and the
    profile of the events (:func:`profile`)."""
    from pyspark.sql import functions as F

    out: dict[str, tuple[np.ndarray, list[str]]] = {}
    events = events_frame(spark, traffic)
    if events is None:
        empty = (np.empty(0, np.int64), [])
        return dict.fromkeys(SOURCES, empty), profile(np.empty(0), np.empty(0), np.empty(0))
    events = events.persist()
    try:
        t, lines, more = _lines(events, "event_time", EVENT_FIELDS, ("user_id", "event_type"))
        out["events"] = (t, lines)
        shape = profile(more["user_id"], t, more["event_type"])
        imp = impressions_frame(events, traffic).persist()
        try:
            t, lines, _ = _lines(
                imp,
                "impression_time",
                ["impression_id", "ad_id", "campaign_id", "user_id", "impression_time"],
            )
            out["impressions"] = (t, lines)
            clicks = imp.where("clicked").select(
                F.md5(F.concat(F.lit(f"c:{traffic.tag}:"), F.col("impression_id"))).alias(
                    "click_id"
                ),
                "impression_id",
                "ad_id",
                "user_id",
                F.timestamp_millis(
                    F.unix_millis("impression_time") + F.col("click_delay_ms")
                ).alias("click_time"),
            )
            t, lines, _ = _lines(
                clicks,
                "click_time",
                ["click_id", "impression_id", "ad_id", "user_id", "click_time"],
            )
            out["clicks"] = (t, lines)
        finally:
            imp.unpersist()
    finally:
        events.unpersist()
    return out, shape


SESSION_GAP_MS = 15 * 60_000  # of gold.sessions: what the profile calls a session


def _quantiles(values: np.ndarray, digits: int = 1) -> dict[str, float]:
    if not len(values):
        return {}
    q = np.quantile(values, [0.5, 0.9, 0.99])
    return {
        "min": round(float(values.min()), digits),
        "median": round(float(q[0]), digits),
        "p90": round(float(q[1]), digits),
        "p99": round(float(q[2]), digits),
        "max": round(float(values.max()), digits),
    }


def profile(users: np.ndarray, times_ms: np.ndarray, types: np.ndarray) -> dict[str, Any]:
    """What the generated events look like as a shop's traffic: sessions as gold.sessions
    finds them (a user's events at most 15 minutes apart) with their events and minutes, the
    share of sessions with a purchase and of events that are purchases, users and events per
    hour, and the busiest user's share of the events."""
    if not len(times_ms):
        return {"events": 0}
    users = np.asarray(users, dtype=np.int64)
    order = np.lexsort((times_ms, users))
    u, t = users[order], np.asarray(times_ms, dtype=np.int64)[order]
    buy = (np.asarray(types, dtype=object) == "purchase")[order]
    new = np.r_[True, (u[1:] != u[:-1]) | (np.diff(t) > SESSION_GAP_MS)]
    heads = np.flatnonzero(new)
    ends = np.r_[heads[1:], len(t)]
    sizes = ends - heads
    minutes = (t[ends - 1] - t[heads]) / 60_000
    bought = np.add.reduceat(buy.astype(np.int64), heads) > 0
    hours = t // 3_600_000
    per_hour = {}
    for h in np.unique(hours):
        mask = hours == h
        per_hour[int(h)] = (int(mask.sum()), len(np.unique(u[mask])))
    events_per_hour = np.array([v[0] for v in per_hour.values()])
    users_per_hour = np.array([v[1] for v in per_hour.values()])
    return {
        "events": int(len(t)),
        "users": int(len(np.unique(u))),
        "sessions": int(len(heads)),
        "events_per_session": _quantiles(sizes.astype(float)),
        "session_minutes": _quantiles(minutes),
        "sessions_with_purchase": round(float(bought.mean()), 4),
        "purchase_share_of_events": round(float(buy.mean()), 4),
        "events_per_hour": _quantiles(events_per_hour.astype(float), 0),
        "users_per_hour": _quantiles(users_per_hour.astype(float), 0),
        "busiest_user_share": round(
            float(np.bincount(np.unique(u, return_inverse=True)[1]).max() / len(t)), 4
        ),
    }


def profile_lines(shape: dict[str, Any]) -> list[str]:
    """The profile as a few lines for people."""
    if not shape.get("events"):
        return ["no events"]

    def q(d: dict[str, float], unit: str = "") -> str:
        return f"min {d['min']:g}{unit}, median {d['median']:g}{unit}, p90 {d['p90']:g}{unit}, p99 {d['p99']:g}{unit}, max {d['max']:g}{unit}"

    return [
        f"{shape['events']:,} events by {shape['users']:,} users in {shape['sessions']:,} sessions "
        f"(a user's events at most 15 minutes apart)",
        f"events per session: {q(shape['events_per_session'])}",
        f"session length: {q(shape['session_minutes'], ' min')}",
        f"sessions with a purchase: {shape['sessions_with_purchase']:.1%}; purchases are "
        f"{shape['purchase_share_of_events']:.2%} of events; the busiest user has "
        f"{shape['busiest_user_share']:.2%} of them",
        f"per hour: events {q(shape['events_per_hour'])}; users {q(shape['users_per_hour'])}",
    ]


# --------------------------------------------------------------------------------------------
# faults


@dataclass
class Landed:
    """Lines of one source waiting to be written, with arrival time and fault kind."""

    arrival: np.ndarray  # epoch ms
    lines: np.ndarray  # object array of str
    kinds: np.ndarray  # int8 codes of _KIND

    @classmethod
    def empty(cls) -> Landed:
        return cls(np.empty(0, np.int64), np.empty(0, object), np.empty(0, np.int8))

    def __len__(self) -> int:
        return len(self.arrival)

    def extend(self, other: Landed) -> Landed:
        return Landed(
            np.concatenate([self.arrival, other.arrival]),
            np.concatenate([self.lines, other.lines]),
            np.concatenate([self.kinds, other.kinds]),
        )

    def take(self, index: np.ndarray) -> Landed:
        return Landed(self.arrival[index], self.lines[index], self.kinds[index])


def inject_faults(
    source: str,
    event_ms: np.ndarray,
    lines: list[str],
    params: GenerateParams,
    rng: np.random.Generator,
) -> Landed:
    """Give each record an arrival time and at most one fault; add resent duplicates.

    - disorder: arrives 1 s to half the watermark after its event time, so the watermark (the
      latest event time seen minus the allowed lateness) never passes it: never dropped;
    - late: arrives 1.5 to 2 watermarks after its event time; dropped by the watermark when a
      micro-batch boundary falls between it and the events that arrived before it;
    - duplicate: an exact copy of a well-formed record, resent 1 s to half the watermark after
      the original arrived, so it is always within the deduplication state;
    - malformed: the line is corrupted in one of the MALFORMED ways (arrives on time);
    - invalid: a well-formed record, on time, that breaks a drop rule of silver's
      (:func:`break_rule`), drawn from a generator of its own among the records left clean,
      so that the other faults of a seed are the same with it or without.
    """
    n = len(lines)
    wm = params.watermark_ms(source)
    arrival = event_ms.astype(np.int64, copy=True)
    kinds = np.zeros(n, np.int8)
    text = np.array(lines, dtype=object)
    perm = rng.permutation(n)
    counts = [
        round(n * f)
        for f in (params.malformed_fraction, params.late_fraction, params.disorder_fraction)
    ]
    bounds = np.cumsum([0, *counts])
    malformed, late, disorder = (perm[bounds[i] : bounds[i + 1]] for i in range(3))
    arrival[late] += rng.integers(wm * 3 // 2, wm * 2, len(late))
    kinds[late] = _KIND["late"]
    arrival[disorder] += rng.integers(1000, max(1001, wm // 2), len(disorder))
    kinds[disorder] = _KIND["disorder"]
    which = rng.integers(0, len(MALFORMED), len(malformed))
    for index, kind in zip(malformed, which, strict=True):
        name = MALFORMED[kind]
        text[index] = corrupt(source, text[index], name, rng)
        kinds[index] = _KIND[name]
    # duplicates: resent copies of records that are neither malformed nor late
    pool = perm[bounds[2] :]
    n_dup = min(len(pool), round(n * params.duplicate_fraction))
    originals = np.sort(rng.choice(pool, n_dup, replace=False)) if n_dup else pool[:0]
    dup = Landed(
        arrival[originals] + rng.integers(1000, max(1001, wm // 2), n_dup),
        text[originals].copy(),
        np.full(n_dup, _KIND["duplicate"], np.int8),
    )
    if params.invalid_fraction:
        # (spawned: the draws above are the same with invalid records or without)
        (own,) = rng.spawn(1)
        clean = np.setdiff1d(perm[bounds[3] :], originals)
        picked = own.choice(clean, min(len(clean), round(n * params.invalid_fraction)), False)
        for index in picked:
            text[index] = break_rule(source, text[index], own)
            kinds[index] = _KIND["invalid"]
    return Landed(arrival, text, kinds).extend(dup)


def break_rule(source: str, line: str, rng: np.random.Generator) -> str:
    """A well-formed record that one of silver's drop rules quarantines (silver/rules): an
    event of an unknown type or a purchase without an amount, an impression or a click before
    2000."""
    record = json.loads(line)
    if source == "events":
        if rng.random() < 0.5:
            record["event_type"] = "refund"
        else:
            record["event_type"], record["amount"] = "purchase", None
    else:
        record[f"{source[:-1]}_time"] = "1999-12-31T23:59:59.000Z"
    return json.dumps(record, separators=(",", ":"))


_WRONG_VALUES = {
    "time": ("not-a-time", "31/12/2025 10:00", "2026-13-45T99:00:00Z"),
    "long": ("n/a", "12abc", "unknown"),
}


def corrupt(source: str, line: str, kind: str, rng: np.random.Generator) -> str:
    """One malformed version of a well-formed JSON line."""
    if kind == "malformed_json":
        return line[: int(rng.integers(1, len(line) - 1))]  # a cut object never parses
    if kind == "empty_line":
        return "" if rng.random() < 0.7 else "   "
    record = json.loads(line)
    if kind == "missing_field":
        name = REQUIRED[source][int(rng.integers(0, len(REQUIRED[source])))]
        if rng.random() < 0.5:
            record.pop(name, None)
        else:
            record[name] = None
    elif kind == "wrong_type":
        name = TYPED_REQUIRED[source][int(rng.integers(0, len(TYPED_REQUIRED[source])))]
        values = _WRONG_VALUES["time" if name.endswith("_time") else "long"]
        record[name] = values[int(rng.integers(0, len(values)))]
    elif kind == "unknown_field":
        if rng.random() < 0.5:
            record["coupon_code"] = f"SAVE{int(rng.integers(5, 50))}"
        else:
            record["experiment"] = {
                "id": int(rng.integers(1, 9)),
                "arm": "AB"[int(rng.random() * 2)],
            }
    else:
        raise ValueError(f"unknown fault kind {kind!r}")
    return json.dumps(record, separators=(",", ":"))


# --------------------------------------------------------------------------------------------
# landing files and the manifest


def _count_kinds(kinds: np.ndarray) -> dict[str, int]:
    found = np.bincount(kinds.astype(np.int64), minlength=len(_KIND))
    return {name: int(found[code]) for name, code in _KIND.items() if name != "none"}


@dataclass
class SourceTally:
    """Counts of what was written for one source."""

    files: list[str] = field(default_factory=list)
    lines: int = 0
    faults: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FAULTS, 0))
    arrival_min_ms: int | None = None
    arrival_max_ms: int | None = None

    def add(self, name: str, landed: Landed) -> None:
        self.files.append(name)
        self.lines += len(landed)
        for kind, n in _count_kinds(landed.kinds).items():
            self.faults[kind] += n
        lo, hi = int(landed.arrival.min()), int(landed.arrival.max())
        self.arrival_min_ms = lo if self.arrival_min_ms is None else min(lo, self.arrival_min_ms)
        self.arrival_max_ms = hi if self.arrival_max_ms is None else max(hi, self.arrival_max_ms)

    def summary(self) -> dict[str, Any]:
        quarantined = {k: self.faults[k] for k in QUARANTINED}
        return {
            "files": len(self.files),
            "first_file": self.files[0] if self.files else None,
            "last_file": self.files[-1] if self.files else None,
            "lines": self.lines,
            "faults": dict(self.faults),
            "bronze_rows": self.lines - sum(quarantined.values()),
            "quarantine": quarantined,
            "first_arrival": _iso(self.arrival_min_ms),
            "last_arrival": _iso(self.arrival_max_ms),
        }


def _iso(ms: int | None) -> str | None:
    if ms is None:
        return None
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat().replace("+00:00", "Z")


class Landing:
    """Writes the landing folder of a lake root: numbered files per source and the manifest."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.dir = self.root / "landing"
        try:
            for source in SOURCES:
                (self.dir / source).mkdir(parents=True, exist_ok=True)
            probe = self.dir / ".write-probe"
            probe.write_text("")
            probe.unlink()
        except OSError as exc:
            raise GenerateError(
                f"cannot write landing files under {self.dir}: {exc.strerror or exc}"
            ) from None
        self.manifest_path = self.dir / MANIFEST
        self.manifest = self._load_manifest()

    def _load_manifest(self) -> dict[str, Any]:
        if not self.manifest_path.exists():
            return {"format": 1, "runs": [], "totals": {}}
        try:
            return json.loads(self.manifest_path.read_text())
        except json.JSONDecodeError as exc:
            raise GenerateError(
                f"{self.manifest_path} is not valid JSON ({exc}); move it away"
            ) from None

    def next_sequence(self, source: str) -> int:
        pattern = re.compile(rf"^{source}-(\d+)\.json$")
        numbers = [
            int(m.group(1)) for p in (self.dir / source).iterdir() if (m := pattern.match(p.name))
        ]
        return max(numbers, default=-1) + 1

    def next_start(self) -> str:
        """Where a new run starts when no --start is given: the first file slice after
        everything earlier runs wrote arrives, so lexical order stays arrival order."""
        last = [
            src["last_arrival"]
            for run in self.manifest["runs"]
            for src in run["sources"].values()
            if src.get("last_arrival")
        ]
        if not last:
            return DEFAULT_START
        latest = max(parse_start(t) for t in last)
        nxt = latest.replace(minute=0, second=0, microsecond=0) + dt.timedelta(hours=1)
        return nxt.isoformat().replace("+00:00", "Z")

    def write_file(self, source: str, seq: int, landed: Landed) -> str:
        """Write one file atomically (Spark ignores names starting with '.' until the rename)."""
        name = f"{source}-{seq:06d}.json"
        final = self.dir / source / name
        if final.exists():
            raise GenerateError(f"{final} already exists; the landing folder changed under us")
        tmp = final.with_name(f".{name}.tmp")
        tmp.write_text("\n".join(landed.lines.tolist()) + "\n", encoding="utf-8")
        # Spark's file stream source orders files by modification time, not by name: stamp
        # each file with its first arrival time (plus its number, so ties keep name order)
        stamp = int(landed.arrival.min()) / 1000 + seq / 1_000_000
        os.utime(tmp, (stamp, stamp))
        os.replace(tmp, final)
        return name

    def record_run(self, run: dict[str, Any]) -> None:
        runs = [r for r in self.manifest["runs"] if r["run"] != run["run"]] + [run]
        totals: dict[str, Any] = {}
        for source in SOURCES:
            parts = [r["sources"][source] for r in runs if source in r["sources"]]
            # (a run recorded before a fault kind existed counts none of it)
            faults = {k: sum(p["faults"].get(k, 0) for p in parts) for k in FAULTS}
            totals[source] = {
                "files": sum(p["files"] for p in parts),
                "lines": sum(p["lines"] for p in parts),
                "faults": faults,
                "bronze_rows": sum(p["bronze_rows"] for p in parts),
                "quarantine": {k: faults[k] for k in QUARANTINED},
            }
        self.manifest = {"format": 1, "runs": runs, "totals": totals}
        tmp = self.manifest_path.with_name(f".{MANIFEST}.tmp")
        tmp.write_text(json.dumps(self.manifest, indent=2) + "\n")
        os.replace(tmp, self.manifest_path)


_USER_ID = re.compile(r'"user_id"\s*:\s*(-?\d+)')


class KafkaSink:
    """Produces what the file sink writes as landing files to Kafka instead: each source's
    lines, in arrival order, as the records of its topic (``topics``, or ``<prefix><source>``;
    created with ``partitions`` partitions when missing), keyed by the line's user id (none when a corrupted line lost
    it), with an idempotent producer (acks=all). Each write is flushed before it returns, so
    what the manifest records was acknowledged by the broker; the manifest gets, per source,
    the first and end offsets written to each partition. ``options``: the client options a
    secured broker needs (librdkafka's names, :meth:`KafkaSettings.client_options`)."""

    def __init__(
        self,
        bootstrap: str,
        partitions: int,
        prefix: str = "",
        *,
        topics: Mapping[str, str] | None = None,
        options: Mapping[str, str] | None = None,
    ):
        from confluent_kafka import Producer

        from lakehouse import kafka_client

        self.topics = {source: (topics or {}).get(source, prefix + source) for source in SOURCES}
        kafka_client.create_topics(bootstrap, list(self.topics.values()), partitions, options)
        self.bootstrap = bootstrap
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 20,
                "message.max.bytes": 2 * 1024 * 1024,
                "log_level": 0,
                **(options or {}),
            }
        )
        self.offsets: dict[str, dict[int, list[int]]] = {t: {} for t in self.topics.values()}
        self.batches = dict.fromkeys(SOURCES, 0)
        self.failed: list[str] = []

    @classmethod
    def from_settings(cls, settings: Settings) -> KafkaSink:
        """The sink to the settings' broker and topics, with their client options."""
        kafka = settings.kafka
        return cls(
            kafka.bootstrap_servers,
            kafka.partitions,
            topics={source: settings.topic(source) for source in SOURCES},
            options=kafka.client_options(),
        )

    def _delivered(self, error, message) -> None:
        if error is not None:
            self.failed.append(error.str())
            return
        span = self.offsets[message.topic()].setdefault(message.partition(), [message.offset()] * 2)
        span[0] = min(span[0], message.offset())
        span[1] = max(span[1], message.offset() + 1)

    def write(self, source: str, landed: Landed) -> str:
        produce, topic = self.producer.produce, self.topics[source]
        for line in landed.lines.tolist():
            found = _USER_ID.search(line)
            key = found.group(1) if found else None
            while True:
                try:
                    produce(topic, value=line.encode(), key=key, on_delivery=self._delivered)
                    break
                except BufferError:  # the local queue is full: let deliveries drain it
                    self.producer.poll(0.1)
        left = self.producer.flush(120)
        if left or self.failed:
            why = self.failed[0] if self.failed else f"{left} records still unacknowledged"
            raise GenerateError(f"Kafka at {self.bootstrap} did not take the records: {why}")
        self.batches[source] += 1
        return f"{source} batch {self.batches[source]}"

    def books(self, source: str) -> dict[str, Any]:
        """What the manifest records of the topic: where the records are."""
        topic = self.topics[source]
        spans = self.offsets[topic]
        return {
            "kafka": {
                "bootstrap": self.bootstrap,
                "topic": topic,
                "offsets": {str(p): spans[p] for p in sorted(spans)},
            }
        }


def split_by_arrival(landed: Landed, start_ms: int, slice_ms: int) -> Iterable[Landed]:
    """Sort lines by arrival (stable: originals before their later copies) and cut them into
    consecutive arrival slices; empty slices yield nothing."""
    order = np.argsort(landed.arrival, kind="stable")
    landed = landed.take(order)
    slot = (landed.arrival - start_ms) // slice_ms
    cuts = np.flatnonzero(np.diff(slot)) + 1
    for lo, hi in zip(np.r_[0, cuts], np.r_[cuts, len(slot)], strict=True):
        if hi > lo:
            yield landed.take(np.arange(lo, hi))


# --------------------------------------------------------------------------------------------
# entry points


def _write(landing: Landing, sink: KafkaSink | None, source: str, part: Landed, seq: int) -> str:
    """Landing file number ``seq`` of ``part``, or one flushed batch of records to Kafka."""
    if sink is not None:
        return sink.write(source, part)
    return landing.write_file(source, seq, part)


def _summary(tally: SourceTally, sink: KafkaSink | None, source: str) -> dict[str, Any]:
    return {**tally.summary(), **(sink.books(source) if sink else {})}


def _run_number(landing: Landing) -> int:
    return 1 + max((r["run"] for r in landing.manifest["runs"]), default=-1)


def _rng(seed: int, run: int, source: str, tick: int = 0) -> np.random.Generator:
    return np.random.default_rng([seed, run, SOURCES.index(source), tick])


def generate(
    spark: SparkSession,
    root: Path,
    params: GenerateParams,
    *,
    progress: Callable[[str], Progress] | None = None,
    sink: KafkaSink | None = None,
) -> dict[str, Any]:
    """Generate one batch of landing files for every source (or of records to Kafka, with
    ``sink``); return this run's manifest entry."""
    params = params.validate()
    landing = Landing(root)
    if params.start is None:
        params = dataclasses.replace(params, start=landing.next_start())
    run = _run_number(landing)
    make_progress = progress or (lambda label: Progress(label))
    started = time.monotonic()
    build = make_progress("building records with dbldatagen")
    build.note(f"{params.events:,} events and their impressions and clicks ...")
    traffic = Traffic(
        events=params.events,
        start_ms=params.start_ms,
        span_ms=int(params.hours * 3_600_000),
        users=params.user_count,
        seed=params.seed,
        tag=f"{params.seed}:{run}",
        conversion=params.conversion,
    )
    records, shape = source_records(spark, traffic)
    build.done(f"{sum(len(r[1]) for r in records.values()):,} records")
    entry: dict[str, Any] = {
        "run": run,
        "mode": "batch",
        "sink": "kafka" if sink else "files",
        "complete": False,  # until every file is written: a crash leaves this visible
        "params": dataclasses.asdict(params),
        "profile": shape,
        "sources": {},
    }
    landing.record_run(entry)
    for source in SOURCES:
        event_ms, lines = records[source]
        landed = inject_faults(source, event_ms, lines, params, _rng(params.seed, run, source))
        tally = SourceTally()
        seq = landing.next_sequence(source)
        slices = list(split_by_arrival(landed, params.start_ms, int(params.file_minutes * 60_000)))
        bar = make_progress(f"producing to topic {source}" if sink else f"writing landing/{source}")
        for i, part in enumerate(slices):
            tally.add(_write(landing, sink, source, part, seq + i), part)
            bar.update(i + 1, len(slices))
        bar.done(f"{tally.lines:,} lines in {len(slices)} {'batches' if sink else 'files'}")
        entry["sources"][source] = _summary(tally, sink, source)
        landing.record_run(entry)
    entry["complete"] = True
    landing.record_run(entry)
    make_progress(f"run {run}").done(f"generated in {time.monotonic() - started:.1f} s")
    return entry


class FollowStream:
    """The clean records of a live stream of ``rate`` events per second from ``start_ms`` on,
    built ahead of time by :meth:`build` and handed out by :meth:`take` once their time comes.

    Records are built FOLLOW_CHUNK_S (``chunk_ms``) of session starts at a time: one dbldatagen
    job per chunk instead of one per tick, since planning a spec costs far more than its rows
    (per tick it took a whole core at 2,000 events/s). The first builds hold the sessions that
    started in the FOLLOW_WARMUP_S before the start, whose later events come after it, so the
    stream runs at its full rate from the start; they are built FOLLOW_BUILD_MAX_EVENTS at a
    time."""

    def __init__(
        self,
        spark: SparkSession,
        params: GenerateParams,
        *,
        rate: float,
        run: int,
        start_ms: int,
        chunk_ms: int,
    ):
        self.spark, self.params, self.rate, self.run = spark, params, rate, run
        self.start_ms, self.chunk_ms = start_ms, chunk_ms
        # as many users as a steady stream at ``rate`` needs for the sessions of a period
        self.users = params.users or default_users(rate * SESSION_PERIOD_S, SESSION_PERIOD_S / 3600)
        # the warm-up's builds: at most FOLLOW_BUILD_MAX_EVENTS, at least a chunk
        self.build_max_ms = max(chunk_ms, int(FOLLOW_BUILD_MAX_EVENTS / rate * 1000))
        self.built_until = start_ms - FOLLOW_WARMUP_S * 1000  # session starts built up to here
        self.chunk = 0
        self.ahead = {s: (np.empty(0, np.int64), np.empty(0, object)) for s in SOURCES}

    def build(self, until_ms: int) -> None:
        """Build the sessions that start before ``until_ms``."""
        while self.built_until < until_ms:
            span_ms = min(max(self.chunk_ms, until_ms - self.built_until), self.build_max_ms)
            records, _ = source_records(
                self.spark,
                Traffic(
                    events=max(1, round(self.rate * span_ms / 1000)),
                    start_ms=self.built_until,
                    span_ms=span_ms,
                    users=self.users,
                    seed=self.params.seed,
                    tag=f"{self.params.seed}:{self.run}:{self.chunk}",
                    daily=False,
                    keep_from_ms=self.start_ms,
                    jitter_s=FOLLOW_JITTER_S,
                    conversion=self.params.conversion,
                ),
            )
            for source in SOURCES:
                event_ms, lines = records[source]
                self.ahead[source] = (
                    np.concatenate([self.ahead[source][0], event_ms]),
                    np.concatenate([self.ahead[source][1], np.array(lines, dtype=object)]),
                )
            self.built_until += span_ms
            self.chunk += 1

    def take(self, source: str, now_ms: int) -> tuple[np.ndarray, np.ndarray]:
        """The built records of ``source`` whose time has come by ``now_ms`` (event time ms,
        JSON lines), taken out of the stream."""
        event_ms, lines = self.ahead[source]
        come = event_ms <= now_ms
        self.ahead[source] = (event_ms[~come], lines[~come])
        return event_ms[come], lines[come]


def follow(
    spark: SparkSession,
    root: Path,
    params: GenerateParams,
    *,
    rate: float,
    interval_s: float,
    ticks: int = 0,
    out=sys.stderr,
    sink: KafkaSink | None = None,
    clock=time,
) -> dict[str, Any]:
    """Every ``interval_s`` seconds, write one small file per source with current event times
    (``rate`` events per second), until ``ticks`` files were written (0: until interrupted).
    ``clock``: what tells the time and waits (``time()`` and ``sleep(s)``: the time module; a
    test's clock moves only when waited on).

    Records are built ahead (:class:`FollowStream`). A tick takes the records whose event time
    has come and gives them their faults. Lines whose arrival time lies in the future
    (disordered, late, resent) wait for the tick that reaches their arrival time; when the loop
    stops, the waiting lines are written in one last file so the manifest accounts for them, and
    the records whose event time has not come yet (the rest of the chunk, clicks still ahead)
    are dropped."""
    params = params.validate()
    if not (0 < rate < math.inf and 0 < interval_s < math.inf):
        raise GenerateError("--rate and --interval must be finite numbers more than 0")
    landing = Landing(root)
    run = _run_number(landing)
    entry: dict[str, Any] = {
        "run": run,
        "mode": "follow",
        "sink": "kafka" if sink else "files",
        "complete": False,
        "rate": rate,
        "interval": interval_s,
        "params": dataclasses.asdict(params),
        "sources": {},
    }
    landing.record_run(entry)
    outbox = _Outbox(landing, sink, entry)
    window_start = int(clock.time() * 1000)
    tick = 0
    stream = FollowStream(
        spark,
        params,
        rate=rate,
        run=run,
        start_ms=window_start,
        chunk_ms=int(max(interval_s, FOLLOW_CHUNK_S) * 1000),
    )
    try:
        while ticks == 0 or tick < ticks:
            deadline = window_start + interval_s * 1000
            clock.sleep(max(0.0, deadline / 1000 - clock.time()))
            now = int(clock.time() * 1000)
            stream.build(now + int(interval_s * 1000))  # the next tick's records too
            n = 0
            for source in SOURCES:
                event_ms, lines = stream.take(source, now)
                rng = _rng(params.seed, run, source, tick)
                outbox.add(source, inject_faults(source, event_ms, list(lines), params, rng))
                n += len(event_ms) if source == "events" else 0
            outbox.emit(now)
            tick += 1
            print(f"tick {tick}: {n} events up to {_iso(now)}", file=out, flush=True)
            window_start = now
    except KeyboardInterrupt:
        print("stopping: writing the lines still waiting for their arrival time", file=out)
    entry["complete"] = True
    outbox.emit(None)
    return entry


class _Outbox:
    """A follow run's lines waiting for their arrival time, what it wrote per source, and its
    manifest entry, recorded after each write."""

    def __init__(self, landing: Landing, sink: KafkaSink | None, entry: dict[str, Any]):
        self.landing, self.sink, self.entry = landing, sink, entry
        self.pending = {s: Landed.empty() for s in SOURCES}
        self.tallies = {s: SourceTally() for s in SOURCES}

    def add(self, source: str, landed: Landed) -> None:
        self.pending[source] = self.pending[source].extend(landed)

    def emit(self, until_ms: int | None) -> None:
        """Write, per source in one file, the lines that arrive by ``until_ms`` (None: all)."""
        for source in SOURCES:
            waiting = self.pending[source]
            due = (
                waiting.arrival <= until_ms if until_ms is not None else np.ones(len(waiting), bool)
            )
            if due.any():
                part = waiting.take(np.flatnonzero(due))
                part = part.take(np.argsort(part.arrival, kind="stable"))
                seq = self.landing.next_sequence(source)
                self.tallies[source].add(_write(self.landing, self.sink, source, part, seq), part)
            self.pending[source] = waiting.take(np.flatnonzero(~due))
        self.entry["sources"] = {s: _summary(self.tallies[s], self.sink, s) for s in SOURCES}
        self.landing.record_run(self.entry)
