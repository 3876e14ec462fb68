"""Synthetic landing data for the three sources of the contract (ARCHITECTURE.md 5).

The records come from dbldatagen specs built on Spark; the faults (resent duplicates, disorder
within the allowed lateness, events later than the watermark, malformed lines) are injected with a
seeded NumPy generator; lines are then written as JSON-lines files under ``landing/<source>/``,
one file per slice of arrival time, named so that lexical order is arrival order. Every injected
fault is counted in ``landing/_manifest.json`` so tests and ``verify`` can account for each line.

Shape of the data:

- users have a skewed activity (user ids near 1 are heavy users); each user session is a burst
  of events spread over 5 to 60 minutes, so consecutive events are sometimes more and sometimes
  less than 15 minutes apart, and bursts of one user overlap or leave idle gaps;
- event types follow a plausible funnel mix; purchase amounts are log-normal (a long tail);
- impressions spread over many ads (skewed popularity) grouped five per campaign; each ad has a
  click-through rate of 1 to 6 percent; clicks follow their impression by up to an hour, and
  about 5 percent of clicks come 1 to 2 hours later (they must not join).
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
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from lakehouse.errors import LakehouseError
from lakehouse.progress import Progress
from lakehouse.settings import Settings, duration_seconds

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

SOURCES = ("events", "impressions", "clicks")
TIME_FIELD = {"events": "event_time", "impressions": "impression_time", "clicks": "click_time"}
REQUIRED = {
    "events": ("event_id", "user_id", "event_time"),
    "impressions": ("impression_id", "ad_id", "campaign_id", "user_id", "impression_time"),
    "clicks": ("click_id", "impression_id", "ad_id", "user_id", "click_time"),
}
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
FAULTS = ("duplicate", "disorder", "late", *MALFORMED)
QUARANTINED = ("malformed_json", "missing_field", "wrong_type", "empty_line")
_KIND = {name: code for code, name in enumerate(("none", *FAULTS))}

DEFAULT_START = "2026-01-05T08:00:00Z"
MANIFEST = "_manifest.json"
IMPRESSIONS_PER_EVENT = 0.4
SPEC_PARTITIONS = 4  # fixed, so the same seed gives the same rows on any machine
EVENTS_PER_SESSION = 20
EVENTS_PER_USER = 100
FOLLOW_CHUNK_S = 60.0  # event time built at once by follow()


class GenerateError(LakehouseError, ValueError):
    """Bad generator arguments or an unusable landing folder."""


@dataclass(frozen=True)
class GenerateParams:
    """What to generate. Fractions are shares of each source's records."""

    events: int = 100_000
    seed: int = 42
    start: str | None = None  # None: DEFAULT_START, or after the previous run of the lake
    hours: float = 6.0  # span of session starts; events of the last sessions run up to 1 h later
    file_minutes: float = 5.0  # arrival time covered by one landing file
    users: int = 0  # 0: one user per 100 events (at least 50)
    duplicate_fraction: float = 0.02
    disorder_fraction: float = 0.05
    late_fraction: float = 0.002
    malformed_fraction: float = 0.005
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
        for name in ("duplicate", "disorder", "late", "malformed"):
            value = getattr(self, f"{name}_fraction")
            if not 0 <= value < 1:
                raise GenerateError(f"--{name}-fraction must be in [0, 1); got {value}")
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
        return self.users or max(50, self.events // EVENTS_PER_USER)

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


def _rand(seed: int, k: int) -> str:
    """A uniform draw in [0, 1) from its own seeded stream. (dbldatagen's own random columns
    seed themselves from the column name, not from ``randomSeed``, so every ``--seed`` would
    give the same draws; Spark's ``rand(seed)`` per partition is deterministic instead.)"""
    return f"rand({(seed * 1009 + k) % (2**62)})"


def _uniform(name: str, seed: int, k: int) -> dict[str, Any]:
    return {"colName": name, "colType": "double", "expr": _rand(seed, k), "omit": True}


def _skewed_user(unit: str, users: int) -> str:
    """A user id in 1..users from a uniform ``unit``: low ids are the heavy users (user 1 gets
    about 1/sqrt(users) of the draws)."""
    return f"1 + cast(floor({users} * pow({unit}, 2)) as bigint)"


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


def events_spec(
    spark: SparkSession,
    rows: int,
    *,
    seed: int,
    tag: str,
    start_ms: int,
    span_s: float,
    users: int,
    session_s: tuple[float, float] = (300.0, 3600.0),
):
    """Events as bursts (sessions): each row picks a session; the session fixes the user, the
    start time, the length, the device and the country; the row's time falls inside it.

    ``session_s`` bounds the length of a burst; (0, 0) places every event on its own uniformly
    in the span (the follow mode: a session's ~20 events at one instant would come in clumps)."""
    sessions = max(1, rows // EVENTS_PER_SESSION)
    low, high = session_s
    place = _unit("session", seed + 1) if high > 0 else "offset"
    return (
        _data_generator(
            spark,
            name="events",
            rows=rows,
            partitions=SPEC_PARTITIONS,
            randomSeed=seed,
            randomSeedMethod="hash_fieldname",
        )
        .withColumn(
            "session",
            "long",
            omit=True,
            expr=f"cast(floor({_rand(seed, 1)} * {sessions}) as bigint)",
        )
        # a few heavy users: user 1 owns ~1/sqrt(users) of the sessions
        .withColumn(
            "user_id",
            "long",
            baseColumn="session",
            expr=_skewed_user(_unit("session", seed), users),
        )
        .withColumn(**_uniform("offset", seed, 2))
        .withColumn(
            "event_time",
            "timestamp",
            baseColumn=["session", "offset"],
            expr=(
                f"timestamp_millis(cast({start_ms} + round(1000 * ("
                f"{place} * {span_s}"
                f" + offset * ({low} + {high - low} * pow({_unit('session', seed + 2)}, 1.5))"
                ")) as bigint))"
            ),
        )
        .withColumn(**_uniform("type_pick", seed, 3))
        .withColumn(
            "event_type",
            "string",
            baseColumn="type_pick",
            expr=(
                "CASE WHEN type_pick < 0.62 THEN 'page_view' WHEN type_pick < 0.82 THEN 'search'"
                " WHEN type_pick < 0.94 THEN 'add_to_cart' ELSE 'purchase' END"
            ),
        )
        .withColumn(**_uniform("page_pick", seed, 4))
        .withColumn(
            "page",
            "string",
            baseColumn=["event_type", "page_pick"],
            expr=(
                "CASE event_type WHEN 'search' THEN '/search' WHEN 'add_to_cart' THEN '/cart'"
                " WHEN 'purchase' THEN '/checkout/complete'"
                " ELSE CASE WHEN page_pick < 0.15 THEN '/'"
                " WHEN page_pick < 0.4 THEN concat('/category/', 1 + cast(page_pick * 997 as int) % 20)"
                " ELSE concat('/product/', 1 + cast(500 * pow((page_pick - 0.4) / 0.6, 2) as int))"
                " END END"
            ),
        )
        .withColumn(
            "amount",
            "double",
            baseColumn="event_type",
            expr=(
                f"CASE WHEN event_type = 'purchase' THEN "
                f"round(least(5000, exp(3.2 + 0.9 * randn({(seed * 1009 + 5) % (2**62)}))), 2) END"
            ),
        )
        .withColumn(
            "device",
            "string",
            baseColumn="session",
            expr=(
                f"CASE WHEN {_unit('session', seed + 4)} < 0.55 THEN 'mobile'"
                f" WHEN {_unit('session', seed + 4)} < 0.93 THEN 'desktop' ELSE 'tablet' END"
            ),
        )
        .withColumn(
            "country",
            "string",
            baseColumn="user_id",
            expr=(
                f"element_at(array('US','US','US','DE','GB','FR','IN','BR','JP','NL'), "
                f"1 + cast(pmod(xxhash64(user_id, {seed + 5}), 10) as int))"
            ),
        )
        .withColumn("event_id", "string", baseColumn="id", expr=f"md5(concat('e:{tag}:', id))")
    )


def impressions_spec(
    spark: SparkSession,
    rows: int,
    *,
    seed: int,
    tag: str,
    start_ms: int,
    span_s: float,
    users: int,
):
    """Impressions over many ads (skewed popularity, five ads per campaign), each carrying
    whether it was clicked and after how long (1 to 6 percent click-through per ad)."""
    ads = max(20, rows // 800)
    return (
        _data_generator(
            spark,
            name="impressions",
            rows=rows,
            partitions=SPEC_PARTITIONS,
            randomSeed=seed + 7,
            randomSeedMethod="hash_fieldname",
        )
        .withColumn("impression_id", "string", baseColumn="id", expr=f"md5(concat('i:{tag}:', id))")
        .withColumn(**_uniform("ad_pick", seed, 11))
        .withColumn(
            "ad_id",
            "long",
            baseColumn="ad_pick",
            expr=f"1 + cast(floor({ads} * pow(ad_pick, 1.6)) as bigint)",
        )
        .withColumn("campaign_id", "long", baseColumn="ad_id", expr="1 + (ad_id - 1) div 5")
        .withColumn(**_uniform("user_pick", seed, 12))
        .withColumn(
            "user_id",
            "long",
            baseColumn="user_pick",
            expr=_skewed_user("user_pick", users),
        )
        .withColumn(**_uniform("time_pick", seed, 13))
        .withColumn(
            "impression_time",
            "timestamp",
            baseColumn="time_pick",
            expr=f"timestamp_millis(cast({start_ms} + round(time_pick * {span_s * 1000}) as bigint))",
        )
        .withColumn(**_uniform("click_pick", seed, 14))
        .withColumn(
            "clicked",
            "boolean",
            baseColumn=["click_pick", "ad_id"],
            expr=f"click_pick < 0.01 + 0.05 * {_unit('ad_id', seed + 8)}",
        )
        .withColumn(**_uniform("delay_pick", seed, 15))
        .withColumn(**_uniform("late_pick", seed, 16))
        # milliseconds from impression to click: up to the 1-hour bound, or 5% beyond it
        .withColumn(
            "click_delay_ms",
            "long",
            baseColumn=["delay_pick", "late_pick"],
            expr=(
                "CASE WHEN late_pick < 0.05 THEN 3600001 + cast(delay_pick * 3599999 as bigint)"
                " ELSE greatest(1000, least(3600000, cast(-ln(1 - delay_pick) * 480000 as bigint)))"
                " END"
            ),
        )
    )


def _lines(df: DataFrame, time_field: str, fields: list[str]) -> tuple[np.ndarray, list[str]]:
    """(event time in epoch ms, JSON line) of every row, in the spec's row order."""
    from pyspark.sql import functions as F

    table = df.select(
        F.unix_millis(F.col(time_field)).alias("t"), F.to_json(F.struct(*fields)).alias("line")
    ).toArrow()
    return table.column("t").to_numpy(), table.column("line").to_pylist()


def source_records(
    spark: SparkSession,
    events: int,
    *,
    seed: int,
    tag: str,
    start_ms: int,
    span_s: float,
    users: int,
    session_s: tuple[float, float] = (300.0, 3600.0),
) -> dict[str, tuple[np.ndarray, list[str]]]:
    """The clean records of every source: (event time ms, JSON line) per source."""
    from pyspark.sql import functions as F

    out: dict[str, tuple[np.ndarray, list[str]]] = {}
    ev = events_spec(
        spark,
        events,
        seed=seed,
        tag=tag,
        start_ms=start_ms,
        span_s=span_s,
        users=users,
        session_s=session_s,
    ).build()
    out["events"] = _lines(
        ev,
        "event_time",
        ["event_id", "user_id", "event_type", "page", "amount", "event_time", "device", "country"],
    )
    rows = round(events * IMPRESSIONS_PER_EVENT)
    imp = impressions_spec(
        spark, rows, seed=seed, tag=tag, start_ms=start_ms, span_s=span_s, users=users
    ).build()
    out["impressions"] = _lines(
        imp,
        "impression_time",
        ["impression_id", "ad_id", "campaign_id", "user_id", "impression_time"],
    )
    clicks = imp.where("clicked").select(
        F.md5(F.concat(F.lit(f"c:{tag}:"), F.col("impression_id"))).alias("click_id"),
        "impression_id",
        "ad_id",
        "user_id",
        F.timestamp_millis(F.unix_millis("impression_time") + F.col("click_delay_ms")).alias(
            "click_time"
        ),
    )
    out["clicks"] = _lines(
        clicks, "click_time", ["click_id", "impression_id", "ad_id", "user_id", "click_time"]
    )
    return out


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
    - malformed: the line is corrupted in one of the MALFORMED ways (arrives on time).
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
    return Landed(arrival, text, kinds).extend(dup)


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
            faults = {k: sum(p["faults"][k] for p in parts) for k in FAULTS}
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
    lines, in arrival order, as the records of topic ``<prefix><source>`` (created with
    ``partitions`` partitions when missing), keyed by the line's user id (none when a corrupted line lost
    it), with an idempotent producer (acks=all). Each write is flushed before it returns, so
    what the manifest records was acknowledged by the broker; the manifest gets, per source,
    the first and end offsets written to each partition."""

    def __init__(self, bootstrap: str, partitions: int, prefix: str = ""):
        from confluent_kafka import Producer

        from lakehouse import kafka

        self.topics = {source: prefix + source for source in SOURCES}
        kafka.create_topics(bootstrap, list(self.topics.values()), partitions)
        self.bootstrap = bootstrap
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 20,
                "message.max.bytes": 2 * 1024 * 1024,
                "log_level": 0,
            }
        )
        self.offsets: dict[str, dict[int, list[int]]] = {t: {} for t in self.topics.values()}
        self.batches = dict.fromkeys(SOURCES, 0)
        self.failed: list[str] = []

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
    records = source_records(
        spark,
        params.events,
        seed=params.seed,
        tag=f"{params.seed}:{run}",
        start_ms=params.start_ms,
        span_s=params.hours * 3600,
        users=params.user_count,
    )
    build.done(f"{sum(len(r[1]) for r in records.values()):,} records")
    entry: dict[str, Any] = {
        "run": run,
        "mode": "batch",
        "sink": "kafka" if sink else "files",
        "complete": False,  # until every file is written: a crash leaves this visible
        "params": dataclasses.asdict(params),
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
) -> dict[str, Any]:
    """Every ``interval_s`` seconds, write one small file per source with current event times
    (``rate`` events per second), until ``ticks`` files were written (0: until interrupted).

    Records are built ahead, FOLLOW_CHUNK_S of event time at once: one dbldatagen job per chunk
    instead of one per tick, since planning a spec costs far more than its rows (per tick it
    took a whole core at 2,000 events/s). A tick takes the records whose event time has come
    and gives them their faults. Lines whose arrival time lies in the future (disordered, late,
    resent) wait for the tick that reaches their arrival time; when the loop stops, the waiting
    lines are written in one last file so the manifest accounts for them, and the records whose
    event time has not come yet (the rest of the chunk, clicks still ahead) are dropped."""
    params = params.validate()
    if not (0 < rate < math.inf and 0 < interval_s < math.inf):
        raise GenerateError("--rate and --interval must be finite numbers more than 0")
    landing = Landing(root)
    run = _run_number(landing)
    users = params.users or max(50, int(rate * 3600) // EVENTS_PER_USER)
    pending = {s: Landed.empty() for s in SOURCES}
    tallies = {s: SourceTally() for s in SOURCES}
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
    window_start = int(time.time() * 1000)
    tick = 0
    chunk_ms = int(max(interval_s, FOLLOW_CHUNK_S) * 1000)
    built_until = window_start  # event time up to which records are built
    chunk = 0
    ahead = {s: (np.empty(0, np.int64), np.empty(0, object)) for s in SOURCES}

    def emit(until_ms: int | None) -> None:
        for source in SOURCES:
            waiting = pending[source]
            due = (
                waiting.arrival <= until_ms if until_ms is not None else np.ones(len(waiting), bool)
            )
            if due.any():
                part = waiting.take(np.flatnonzero(due))
                part = part.take(np.argsort(part.arrival, kind="stable"))
                seq = landing.next_sequence(source)
                tallies[source].add(_write(landing, sink, source, part, seq), part)
            pending[source] = waiting.take(np.flatnonzero(~due))
        entry["sources"] = {s: _summary(tallies[s], sink, s) for s in SOURCES}
        landing.record_run(entry)

    try:
        while ticks == 0 or tick < ticks:
            deadline = window_start + interval_s * 1000
            time.sleep(max(0.0, deadline / 1000 - time.time()))
            now = int(time.time() * 1000)
            while built_until < now + interval_s * 1000:  # the next tick's records too
                records = source_records(
                    spark,
                    max(1, round(rate * chunk_ms / 1000)),
                    seed=params.seed + chunk,
                    tag=f"{params.seed}:{run}:{chunk}",
                    start_ms=built_until,
                    span_s=chunk_ms / 1000,
                    users=users,
                    session_s=(0.0, 0.0),
                )
                for source in SOURCES:
                    event_ms, lines = records[source]
                    ahead[source] = (
                        np.concatenate([ahead[source][0], event_ms]),
                        np.concatenate([ahead[source][1], np.array(lines, dtype=object)]),
                    )
                built_until += chunk_ms
                chunk += 1
            n = 0
            for source in SOURCES:
                event_ms, lines = ahead[source]
                come = event_ms <= now
                landed = inject_faults(
                    source,
                    event_ms[come],
                    list(lines[come]),
                    params,
                    _rng(params.seed, run, source, tick),
                )
                ahead[source] = (event_ms[~come], lines[~come])
                pending[source] = pending[source].extend(landed)
                n += int(come.sum()) if source == "events" else 0
            emit(now)
            tick += 1
            print(f"tick {tick}: {n} events up to {_iso(now)}", file=out, flush=True)
            window_start = now
    except KeyboardInterrupt:
        print("stopping: writing the lines still waiting for their arrival time", file=out)
    entry["complete"] = True
    emit(None)
    return entry
