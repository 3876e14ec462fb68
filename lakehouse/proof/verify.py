"""``lakehouse verify``: every table of the lake against an independent batch computation.

The reference is computed with pandas straight from the landing files, the quality rules and the
generator's manifest, following the data contract (docs/architecture.md 7); it shares no code with
the streaming transforms (gold uses :mod:`lakehouse.proof.oracle`, written the same way):

- bronze: every landing line parsed with Python's ``json``: a typed row, or a quarantine row
  with its reason (empty line, malformed JSON, missing required field, wrong type);
- silver: the contract's cleaning, the quality rules evaluated in pandas, the first copy of each
  id kept, impressions left-joined to the clicks within the hour, an unmatched impression
  written once the final watermark has passed its hour;
- gold: :mod:`lakehouse.proof.oracle` over the reference silver.

The books of silver.events must balance whatever the data: its input = kept + quarantined +
duplicates + late drops (counted in ``ops.stream_progress``; a batch whose count a crash lost
is recounted by the runner's next start). When the manifest says no line arrived later than
its watermark, streaming must equal batch (invariant 2) and every table is compared row for row.
Otherwise which late rows Spark drops depends on micro-batch boundaries, so verify checks the
books instead: bronze still row for row, silver.events and silver.ad_attribution hold no row
the reference lacks, and gold is compared with the batch computation over the silver tables
found, its differences shown but not failed: a row silver kept can still be behind a gold
flow's own watermark in the micro-batch that brings it (the gold flows' late drops are printed).

Per table it prints rows expected, found, missing, unexpected and differing (same key, other
values), with a few examples, and returns 1 on any difference. Doubles are equal within a
relative tolerance of 1e-9 (``REL_TOLERANCE``; ``ABS_TOLERANCE`` near 0), never rounded, and
the output says so; every other type is compared exactly.

The reference parses what the contract and the generator produce: JSON objects with ISO-8601
times. Bronze refuses what Python's json module refuses (single quotes, text after the object),
but Spark still reads some input Python reads otherwise (timestamps with zone names), so on such
lines the two may disagree: verify then reports them, and either side may be the one to fix.
"""

from __future__ import annotations

import bz2
import datetime as dt
import gzip
import json
import math
import re
import sys
import tomllib
import zlib
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import TextIO

import numpy as np
import pandas as pd

from lakehouse.contract import EVENT_TIME, FIELDS, ID, MANIFEST, REQUIRED
from lakehouse.errors import LakehouseError
from lakehouse.ops.status import read_table
from lakehouse.proof import oracle
from lakehouse.runner.monitoring import Drops
from lakehouse.settings import Settings, duration_seconds
from lakehouse.text import aligned

EXAMPLES = 3  # rows shown per kind of difference
# Doubles are equal when within REL_TOLERANCE of each other, relative to the larger (or
# ABS_TOLERANCE apart, for values that should be 0): sums and means of doubles computed in
# another order, or merged batch by batch, differ by a few ulps. Never by rounding: two values
# a few ulps apart can straddle a rounding boundary (1399.7329374999 and 1399.7329375001).
# Every other type is compared exactly.
REL_TOLERANCE = 1e-9
ABS_TOLERANCE = 1e-9
TOLERANCE_NOTE = (
    f"(doubles equal within {REL_TOLERANCE:g} relative or {ABS_TOLERANCE:g} absolute; "
    "every other value exactly)"
)

CLICK_WINDOW = pd.Timedelta(hours=1)
# the data contract's quarantine reason of a compressed landing file that does not decompress
UNREADABLE = "unreadable_file"
_INTEGER = re.compile(r"^\s*[+-]?\d+\s*$")
_NUMBER = re.compile(r"^\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*$")
_WHEN = re.compile(r"^\s*(\w+)\s*(=|<>|!=)\s*'([^']*)'\s*$")


class VerifyError(LakehouseError, RuntimeError):
    """The lake cannot be verified (no manifest, a rule verify cannot evaluate)."""


# ---- bronze: landing lines ------------------------------------------------------------------


BOM = b"\xef\xbb\xbf"


@dataclass(frozen=True)
class LandingLine:
    file: str
    text: str | None  # invalid UTF-8 replaced by U+FFFD; None: a Kafka record's null value
    utf8: bool  # False: the line's bytes are not UTF-8
    size: int = 0  # bytes (after a byte-order mark)
    unreadable: str | None = None  # a compressed file that does not decompress: why
    unread: bool = False  # a line too long to read (bronze.max_line_bytes): no text


def landing_lines(settings: Settings, source: str) -> list[LandingLine]:
    """Every landing line of ``source``, in arrival (file name) order: files named ``.gz``,
    ``.bz2`` or ``.deflate`` decompressed (one unreadable line for such a file that does not
    decompress to its end), a byte-order mark that starts a line dropped, a line Spark
    skips as too long (:func:`_file_lines`) without its text. With
    ``bronze.source = "kafka"``: every record of topic ``source`` (:func:`kafka_lines`)."""
    if settings.bronze.source == "kafka":
        kafka = settings.kafka
        return kafka_lines(kafka.bootstrap_servers, settings.topic(source), kafka.client_options())
    folder = settings.landing_path(source)
    lines = []
    # every file Spark's file source reads: not hidden, not starting with "_"
    names = (p for p in folder.iterdir() if p.is_file() and not p.name.startswith(("_", ".")))
    for path in sorted(names):
        try:
            data = _decompressed(path)
        except _Unreadable as exc:
            lines.append(LandingLine(path.name, None, True, unreadable=str(exc)))
            continue
        lines.extend(_file_lines(path.name, data, settings.bronze.max_line_bytes))
    return lines


class _Unreadable(LakehouseError, ValueError):
    """A compressed landing file that does not decompress to its end (a row of the reference's
    quarantine, never an error a user sees)."""


def _decompressed(path) -> bytes:
    """A landing file's bytes, decompressed whole by the standard library when its name ends
    in one of the suffixes Spark's text source decompresses (``.gz``, ``.bz2``, ``.deflate``:
    a zlib stream); :class:`_Unreadable` when they stop before the stream's end. (Read here,
    not with the pipeline's lakehouse.landing: the reference shares no code with bronze.)"""
    raw = path.read_bytes()
    try:
        if path.suffix == ".gz":
            return gzip.decompress(raw)
        if path.suffix == ".bz2":
            return bz2.decompress(raw)
        if path.suffix == ".deflate":
            stream = zlib.decompressobj()
            data = stream.decompress(raw) + stream.flush()
            if not stream.eof:
                raise EOFError("no end of stream")
            return data
    except (OSError, EOFError, ValueError, zlib.error) as exc:
        raise _Unreadable(f"{path.suffix} data that does not decompress: {exc}") from None
    return raw


_LINE = re.compile(rb"(.*?)(\r\n|\r|\n|$)", re.DOTALL)


def _file_lines(name: str, data: bytes, max_line_bytes: int) -> list[LandingLine]:
    """The lines of a landing file's bytes, ended at ``\\r\\n``, ``\\r`` or ``\\n`` as
    Hadoop's line reader ends them. A line whose bytes with its line end reach
    ``max_line_bytes`` (a byte-order mark starting the file not counted) is one the reader
    skips: unread, with no text."""
    lines = []
    for number, match in enumerate(_LINE.finditer(data), start=1):
        if match.start() == len(data):
            break  # after the line end of the last line (or an empty file)
        raw, end = match.group(1), match.group(2)
        size = len(raw.removeprefix(BOM)) if number == 1 else len(raw)
        if size + len(end) >= max_line_bytes:
            lines.append(LandingLine(name, None, True, size, unread=True))
        else:
            lines.append(_line(name, raw))
    return lines


def _line(file: str, raw: bytes) -> LandingLine:
    """A line from its bytes: a leading byte-order mark dropped, decoded when it is UTF-8."""
    raw = raw.removeprefix(BOM)
    try:
        return LandingLine(file, raw.decode("utf-8"), True, len(raw))
    except UnicodeDecodeError:
        return LandingLine(file, raw.decode("utf-8", "replace"), False, len(raw))


def kafka_lines(
    bootstrap: str, topic: str, options: Mapping[str, str] | None = None
) -> list[LandingLine]:
    """Every record of ``topic`` still on the broker, partition by partition in offset order,
    as a line: its value decoded (None for a null value), and as its "file" its place and
    time, ``kafka:<topic>/<partition>/<offset>@<timestamp>``, as bronze records it.
    ``options``: the client options a secured broker needs (librdkafka's names)."""
    from confluent_kafka import Consumer, TopicPartition

    from lakehouse.kafka_client import Client, KafkaError

    client = Client(bootstrap, {"group.id": "lakehouse-verify", **(options or {})})
    consumer = Consumer({**client.config, "enable.auto.commit": False})
    lines: list[LandingLine] = []
    try:
        try:
            partitions = client.metadata(consumer, 10, topic).topics[topic].partitions
        except KafkaError as exc:
            raise VerifyError(str(exc)) from None
        for partition in sorted(partitions):
            first, end = consumer.get_watermark_offsets(TopicPartition(topic, partition), 10)
            if end <= first:
                continue
            consumer.assign([TopicPartition(topic, partition, first)])
            offset = first
            while offset < end:
                message = consumer.poll(10)
                if message is None:
                    raise VerifyError(f"topic {topic} at {bootstrap}: no record at {offset}")
                if message.error():
                    raise VerifyError(f"topic {topic} at {bootstrap}: {message.error().str()}")
                offset = message.offset() + 1
                at = pd.Timestamp(message.timestamp()[1], unit="ms", tz="UTC")
                place = (
                    f"kafka:{topic}/{partition}/{message.offset()}@"
                    f"{at:%Y-%m-%dT%H:%M:%S}.{at.microsecond // 1000:03d}Z"
                )
                value = message.value()
                lines.append(
                    LandingLine(place, None, True) if value is None else _line(place, value)
                )
    finally:
        consumer.close()
    return lines


def _typed(kind: str, value):
    """The value of a JSON field as its contract type; ``None`` when it does not convert."""
    if value is None:
        return None
    if kind == "string":
        if isinstance(value, str):
            return value
        return json.dumps(value, separators=(",", ":"))  # a scalar or object kept as its text
    if isinstance(value, bool | dict | list):
        return None
    if kind == "long":
        if isinstance(value, str) and _INTEGER.match(value):
            value = int(value)
        if isinstance(value, int) and LONG_MIN <= value <= LONG_MAX:
            return value
        return None  # (beyond a long: Spark's cast gives null too)
    if kind == "double":
        if isinstance(value, _Overflow):
            return None
        if isinstance(value, str) and _NUMBER.match(value):
            value = float(value)
        if isinstance(value, int):
            try:
                return float(value)
            except OverflowError:  # Spark's cast of the digits gives infinity
                return float("inf") if value > 0 else float("-inf")
        return float(value) if isinstance(value, float) else None
    try:  # time: ISO-8601 only
        stamp = pd.to_datetime(str(value), format="ISO8601", utc=True)
    except pd.errors.OutOfBoundsDatetime:
        # years 1 to 1677 and 2262 to 9999: times Spark holds and pandas' nanoseconds do not
        try:
            stamp = dt.datetime.fromisoformat(str(value).strip().replace("Z", "+00:00"))
        except ValueError:
            return None
        return stamp.replace(tzinfo=dt.UTC) if stamp.tzinfo is None else stamp.astimezone(dt.UTC)
    except (ValueError, TypeError):
        return None
    return None if pd.isna(stamp) else stamp


LONG_MIN, LONG_MAX = -(2**63), 2**63 - 1


class _Overflow(float):
    """A JSON number too large for a double (``1e400``): Spark's parser does not read it as a
    number, Python's would read infinity."""


class _Object(dict):
    """A JSON object; ``repeated`` names the keys it has more than once."""

    repeated: tuple[str, ...] = ()


def _object(pairs: list[tuple[str, object]]) -> _Object:
    record = _Object(pairs)
    if len(record) < len(pairs):
        seen: Counter = Counter(key for key, _ in pairs)
        record.repeated = tuple(key for key, n in seen.items() if n > 1)
    return record


def _float(text: str) -> float:
    value = float(text)
    return _Overflow(value) if value in (float("inf"), float("-inf")) else value


def parse_line(source: str, line: str, utf8: bool = True) -> tuple[dict | None, str | None]:
    """(typed row, None) for a line that belongs in bronze.<source>, else (None, reason)."""
    if not utf8:
        return None, "invalid_utf8"
    if line is None or not line.strip():  # None: a Kafka record's null value
        return None, "empty_line"
    try:
        record = json.loads(line, object_pairs_hook=_object, parse_float=_float)
    except ValueError:
        return None, "malformed_json"
    if not isinstance(record, dict):
        return None, "malformed_json"
    if record.repeated:
        return None, "repeated_key"
    fields = FIELDS[source]
    row = {name: _typed(kind, record.get(name)) for name, kind in fields.items()}
    if any(record.get(name) is None for name in REQUIRED[source]):
        return None, "missing_field"
    if any(row[name] is None for name in REQUIRED[source]):
        return None, "wrong_type"
    row["_rescued"] = any(
        name not in fields or (record[name] is not None and row[name] is None) for name in record
    )
    return row, None


def bronze_reference(settings: Settings, source: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(bronze.<source> rows, quarantine rows) the landing lines of ``source`` must give, in
    arrival order."""
    rows, bad = [], []
    for line in landing_lines(settings, source):
        if line.unreadable:
            row, reason = None, UNREADABLE
        elif line.unread or line.size > settings.bronze.max_record_bytes:
            row, reason = None, "too_large"
        else:
            row, reason = parse_line(source, line.text, line.utf8)
        if row is None:
            bad.append(
                {"source": source, "reason": reason, "raw": line.text, "_source_file": line.file}
            )
        else:
            row["_source_file"] = line.file
            rows.append(row)
    columns = [*FIELDS[source], "_rescued", "_source_file"]
    frame = pd.DataFrame(rows, columns=columns)
    for name, kind in FIELDS[source].items():
        if kind == "time":
            frame[name] = _times(frame[name])
    return frame, pd.DataFrame(bad, columns=["source", "reason", "raw", "_source_file"])


def _times(values: pd.Series) -> pd.Series:
    """Parsed times as a UTC column: nanoseconds, or microseconds when a time is beyond
    pandas' nanosecond range (years 1 to 9999 are Spark's)."""
    if any(isinstance(v, dt.datetime) and not isinstance(v, pd.Timestamp) for v in values):
        plain = [
            None if v is None or pd.isna(v) else pd.Timestamp(v).to_pydatetime() for v in values
        ]
        return pd.Series(pd.array(plain, dtype="datetime64[us, UTC]"), index=values.index)
    return pd.to_datetime(values, utc=True)


def _nanoseconds(frame: pd.DataFrame, table: str) -> pd.DataFrame:
    """``frame`` with its times in nanoseconds again, as the silver and gold references use
    them (the quality rules quarantine the times beyond pandas' range)."""
    wider = [
        name
        for name, dtype in frame.dtypes.items()
        if isinstance(dtype, pd.DatetimeTZDtype) and dtype.unit != "ns"
    ]
    out = frame.copy() if wider else frame  # (only a lake with such times pays for the copy)
    for name in wider:
        try:
            out[name] = out[name].astype("datetime64[ns, UTC]")
        except (pd.errors.OutOfBoundsDatetime, OverflowError):
            raise VerifyError(
                f"{table}: a kept {name} is outside the years 1678 to 2261, which verify "
                "cannot compute with; add a quality rule that quarantines such times"
            ) from None
    return out


# ---- silver ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    name: str
    check: str
    column: str
    action: str
    spec: dict = field(default_factory=dict)

    def applies(self, frame: pd.DataFrame) -> pd.Series:
        when = self.spec.get("when")
        if not when:
            return pd.Series(True, index=frame.index)
        match = _WHEN.match(when)
        if not match:
            raise VerifyError(
                f"rule {self.name}: verify evaluates only `when = \"<column> = '<text>'\"` "
                f"(or <>), not {when!r}"
            )
        column, op, text = match.groups()
        equal = frame[column] == text
        return (equal if op == "=" else ~equal & frame[column].notna()).fillna(False)

    def breaks(self, frame: pd.DataFrame, now: pd.Timestamp) -> pd.Series:
        """True where the rule applies and the row breaks it (checks other than the null ones
        pass a null value)."""
        value = frame[self.column]
        null = value.isna()
        if self.check == "not_null":
            bad = null
        elif self.check == "null":
            bad = ~null
        elif self.check == "in_set":
            bad = ~null & ~value.isin(self.spec["values"])
        elif self.check == "between":
            low, high = self.spec.get("min"), self.spec.get("max")
            bad = pd.Series(False, index=frame.index)
            if low is not None:
                bad |= ~null & (value < low)
            if high is not None:
                bad |= ~null & (value > high)
        elif self.check == "regex":
            text = value.astype("string")
            bad = ~null & ~text.str.contains(self.spec["pattern"], regex=True).fillna(True)
        elif self.check == "not_after_now":
            limit = now + pd.Timedelta(seconds=duration_seconds(self.spec["within"]))
            bad = ~null & (value > limit)
        else:
            raise VerifyError(f"rule {self.name}: unknown check {self.check!r}")
        return self.applies(frame) & bad.astype(bool)


def load_rules(name: str) -> list[Rule]:
    """The rules of ``silver/rules/<name>.toml``, read as data (not through the quality
    module)."""
    text = (resources.files("silver") / "rules" / f"{name}.toml").read_text()
    return [
        Rule(r["name"], r["check"], r["column"], r["action"], r)
        for r in tomllib.loads(text).get("rule", [])
    ]


def quality(frame: pd.DataFrame, rules: list[Rule], now: pd.Timestamp):
    """(kept rows, quarantined rows with the names of every rule they broke)."""
    broken = pd.DataFrame({r.name: r.breaks(frame, now) for r in rules}, index=frame.index)
    drop_rules = [r.name for r in rules if r.action == "drop"]
    dropped = broken[drop_rules].any(axis=1) if drop_rules else pd.Series(False, frame.index)
    names = broken.apply(lambda row: tuple(sorted(row.index[row.to_numpy()])), axis=1)
    quarantined = frame[dropped].assign(rules=names[dropped] if len(frame) else [])
    return frame[~dropped], quarantined


def clean_events(frame: pd.DataFrame) -> pd.DataFrame:
    """The contract's cleaning of events: text trimmed (spaces), codes in one case."""
    out = frame.copy()
    for name in ("event_id", "event_type", "page", "device", "country"):
        out[name] = out[name].str.strip(" ")
    out["event_type"] = out["event_type"].str.lower()
    out["device"] = out["device"].str.lower()
    out["country"] = out["country"].str.upper()
    return out


def first_copies(frame: pd.DataFrame, key: str) -> pd.DataFrame:
    """The first row (in arrival order) of each ``key``: later copies are duplicates."""
    return frame[~frame.duplicated(key, keep="first")]


def attribution_reference(
    impressions: pd.DataFrame, clicks: pd.DataFrame, settings: Settings
) -> pd.DataFrame:
    """Impressions LEFT OUTER JOIN clicks on the impression within the hour after it; an
    impression without a click only once the final watermark (the lower of both sides'
    latest time minus their lateness) has passed its hour."""
    lateness = {
        side: pd.Timedelta(seconds=duration_seconds(getattr(settings.watermarks, side)))
        for side in ("impressions", "clicks")
    }
    # Spark's global watermark is the lower of the two sides', and a side that has seen no row
    # holds it at 0: then no impression is ever given up on
    sides = (("impressions", impressions), ("clicks", clicks))
    if all(len(frame) for _, frame in sides):
        final = min(frame[EVENT_TIME[side]].max() - lateness[side] for side, frame in sides)
    else:
        final = None
    imp = impressions[["impression_id", "ad_id", "campaign_id", "user_id", "impression_time"]]
    pairs = imp.merge(
        clicks[["click_id", "impression_id", "click_time"]], on="impression_id", how="inner"
    )
    pairs = pairs[
        (pairs["click_time"] >= pairs["impression_time"])
        & (pairs["click_time"] <= pairs["impression_time"] + CLICK_WINDOW)
    ]
    alone = imp[~imp["impression_id"].isin(pairs["impression_id"])]
    if final is None:
        alone = alone.iloc[:0]
    else:
        alone = alone[alone["impression_time"] + CLICK_WINDOW < final]
    alone = alone.assign(click_id=None, click_time=pd.NaT)
    return pd.concat([pairs, alone], ignore_index=True)


# ---- comparing ------------------------------------------------------------------------------


def _normal(value):
    """A hashable, comparable form of a cell: times as UTC microseconds, doubles as floats
    (compared by :func:`_close`, never rounded)."""
    if value is None or (np.isscalar(value) and pd.isna(value)):
        return None
    if isinstance(value, pd.Timestamp | dt.datetime | np.datetime64):
        stamp = pd.Timestamp(value)
        stamp = stamp.tz_localize("UTC") if stamp.tzinfo is None else stamp.tz_convert("UTC")
        return int(stamp.as_unit("us").asm8.view("i8"))
    if isinstance(value, float | np.floating):
        return float(value)
    if isinstance(value, np.integer | np.bool_):
        return value.item()
    if isinstance(value, dict):
        return tuple(sorted((k, _normal(v)) for k, v in value.items()))
    if isinstance(value, list | tuple | np.ndarray):
        items = tuple(_normal(v) for v in value)
        if items and all(isinstance(i, tuple) and len(i) == 2 for i in items):
            return tuple(sorted(items))  # a map read back as (key, value) pairs
        return items
    return value


def _rows(frame: pd.DataFrame, columns: list[str]) -> list[tuple]:
    return [tuple(_normal(v) for v in row) for row in frame[columns].itertuples(index=False)]


def _close(a, b) -> bool:
    """Two normalised cells or rows are the same: doubles within the tolerances above (inside
    maps and arrays too), everything else exactly."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or math.isclose(a, b, rel_tol=REL_TOLERANCE, abs_tol=ABS_TOLERANCE)
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


@dataclass
class Check:
    table: str
    expected: int
    found: int
    missing: list[tuple] = field(default_factory=list)
    unexpected: list[tuple] = field(default_factory=list)
    differing: list[tuple[tuple, tuple]] = field(default_factory=list)
    columns: list[str] = field(default_factory=list)
    note: str = ""
    books: list[str] = field(default_factory=list)
    books_ok: bool = True
    # why differences are shown but not failed (late data in gold), or ""
    tolerated: str = ""

    @property
    def apart(self) -> int:
        """Rows in one side only, or differing between the sides."""
        return len(self.missing) + len(self.unexpected) + len(self.differing)

    @property
    def same(self) -> bool:
        return not self.apart and self.books_ok

    @property
    def ok(self) -> bool:
        return self.same or bool(self.tolerated)

    @property
    def empty(self) -> bool:
        """Equal because neither side has a row: nothing was compared (a lake too short for
        the table's windows to close, say), which verify says rather than calling it ok."""
        return self.same and not self.expected and not self.found

    @property
    def status(self) -> str:
        if self.empty:
            return "empty"
        if self.same:
            return "ok"
        return "differs (late data)" if self.ok else "DIFFERENT"


def compare(
    table: str,
    expected: pd.DataFrame,
    found: pd.DataFrame,
    columns: list[str],
    keys: list[str],
    note: str = "",
) -> Check:
    """Rows of ``expected`` and ``found`` over ``columns`` as multisets; a missing and an
    unexpected row with the same ``keys`` are the same row when their cells are close
    (:func:`_close`: doubles within a relative tolerance of REL_TOLERANCE), else one differing
    row."""
    absent = [c for c in columns if c not in found.columns]
    if absent and len(found):
        raise VerifyError(f"{table} has no column(s) {', '.join(absent)}")
    found = found if len(found) else pd.DataFrame(columns=columns)
    want, have = Counter(_rows(expected, columns)), Counter(_rows(found, columns))
    missing = list((want - have).elements())
    unexpected = list((have - want).elements())
    index = [columns.index(k) for k in keys]
    pending: dict[tuple, list[tuple]] = {}
    for row in unexpected:
        pending.setdefault(tuple(row[i] for i in index), []).append(row)
    check = Check(table, len(expected), len(found), columns=columns, note=note)
    for row in missing:
        candidates = pending.get(tuple(row[i] for i in index))
        if candidates:
            # the close one among the rows with this key, else any: a differing row
            near = next((n for n, other in enumerate(candidates) if _close(row, other)), None)
            other = candidates.pop(-1 if near is None else near)
            if near is None:
                check.differing.append((row, other))
        else:
            check.missing.append(row)
    check.unexpected = [row for rows in pending.values() for row in rows]
    return check


# ---- the books of silver.events, row by row -------------------------------------------------


def _keys(frame: pd.DataFrame, id_column: str) -> Counter:
    """The rows of a table as (id, landing file or record) keys, counted: a bronze row's
    identity (resent copies share their id, and may share their file)."""
    if not len(frame):
        return Counter()
    ids = frame[id_column].astype(str).str.strip(" ")
    return Counter(zip(ids, frame["_source_file"], strict=True))


def _record_keys(frame: pd.DataFrame, by: str, flow: str, id_field: str) -> Counter:
    """The keys of the rows of ``flow`` in a table holding them as JSON (``record``)."""
    if not len(frame):
        return Counter()
    mine = frame[frame[by] == flow]
    ids = [str(json.loads(r).get(id_field)).strip(" ") for r in mine["record"]]
    return Counter(zip(ids, mine["_source_file"], strict=True))


@dataclass
class RowBooks:
    """Where each bronze row went: counts per place, and the rows in no place or in two."""

    bronze: int
    kept: int
    quarantined: int
    late: int
    duplicates: int
    lost: list[tuple]  # bronze rows in no place, and not a copy of a kept row
    twice: list[tuple]  # rows in more places than bronze has copies of them (or none)
    counted: Drops  # what the stateful operators counted

    @property
    def ok(self) -> bool:
        return (
            not self.lost
            and not self.twice
            and (self.duplicates, self.late) == (self.counted.duplicates, self.counted.late)
        )

    def lines(self) -> list[str]:
        out = [
            f"{self.bronze:,} bronze rows = {self.kept:,} kept + {self.quarantined:,} "
            f"quarantined + {self.late:,} late (silver.late_events) + {self.duplicates:,} "
            "duplicates of kept rows, row by row"
            + ("" if not (self.lost or self.twice) else ": DOES NOT BALANCE")
        ]
        if (self.duplicates, self.late) != (self.counted.duplicates, self.counted.late):
            out.append(
                f"the stateful operator counted {self.counted.duplicates:,} duplicates and "
                f"{self.counted.late:,} late rows: DIFFERENT"
            )
        for what, rows in (("in no place", self.lost), ("in two places", self.twice)):
            if rows:
                examples = ", ".join(str(r) for r in rows[:EXAMPLES])
                out.append(f"{len(rows):,} bronze row(s) {what}, e.g. {examples}")
        return out


def row_books(
    bronze: Counter, kept: Counter, quarantined: Counter, late: Counter, counted: Drops
) -> RowBooks:
    """Balance bronze rows (by :func:`_keys`) against the silver places they can be in."""
    placed = kept + quarantined + late
    twice = list((placed - bronze).elements())
    rest = bronze - placed
    kept_ids = {key[0] for key in kept}
    lost = [key for key in rest.elements() if key[0] not in kept_ids]
    return RowBooks(
        bronze=sum(bronze.values()),
        kept=sum(kept.values()),
        quarantined=sum(quarantined.values()),
        late=sum(late.values()),
        duplicates=sum(rest.values()) - len(lost),
        lost=lost,
        twice=twice,
        counted=counted,
    )


def _late_rows(late: pd.DataFrame, flow: str) -> pd.DataFrame:
    """The rows of silver.late_events (``late``) that ``flow`` dropped."""
    return late[late["flow"] == flow] if len(late) else late


def _late_keys(rows: pd.DataFrame, source: str) -> Counter:
    """The (id, landing file) keys of the late rows ``rows`` of one flow (:func:`_late_rows`)
    that came from ``bronze.<source>``."""
    return _record_keys(rows, "input", f"bronze.{source}", ID[source])


def late_events_check(
    settings: Settings, found: pd.DataFrame, bronze: dict[str, pd.DataFrame], books_mode: bool
) -> Check:
    """silver.late_events (``found``): none without late input; with it, each row is a bronze
    row of its flow's input, and each flow holds as many as its stateful operators dropped as
    late."""
    check = compare(
        "silver.late_events",
        pd.DataFrame(columns=["flow", "input", "record"]),
        found,
        ["flow", "input", "record"],
        ["flow", "input", "record"],
    )
    for flow, inputs in (
        ("silver.events", ("events",)),
        ("silver.ad_attribution", ("impressions", "clicks")),
    ):
        rows = _late_rows(found, flow)
        unknown = 0
        for source in inputs:
            known = _keys(bronze[source], ID[source])
            unknown += sum((_late_keys(rows, source) - known).values())
        counted = _drops(settings, flow).late
        check.books_ok = check.books_ok and unknown == 0 and len(rows) == counted
        check.books.append(
            f"{len(rows):,} rows of {flow}, {counted:,} dropped as late by its operators"
            + ("" if len(rows) == counted else ": DIFFERENT")
            + (f"; {unknown:,} not in bronze" if unknown else "")
        )
    if books_mode:
        check.note = "books (late data)"
        check.unexpected = []
    return check


# ---- the whole lake -------------------------------------------------------------------------


def _found(settings: Settings, name: str) -> pd.DataFrame:
    frame = read_table(settings, name)
    if "_source_file" in frame.columns:  # a URI; the reference has the landing file's name
        files = frame["_source_file"]
        frame["_source_file"] = files.where(
            files.str.startswith("kafka:"), files.str.rsplit("/", n=1).str[-1]
        )
    for column in frame.columns:
        if pd.api.types.is_datetime64_any_dtype(frame[column]):
            times = frame[column]
            naive = not isinstance(times.dtype, pd.DatetimeTZDtype)
            frame[column] = times.dt.tz_localize("UTC") if naive else times.dt.tz_convert("UTC")
    return frame


def _manifest(settings: Settings) -> dict:
    path = settings.landing_path() / MANIFEST
    if not path.is_file():
        raise VerifyError(
            f"{path} does not exist: verify needs the landing files and the manifest that "
            "`lakehouse generate` writes beside them"
        )
    return json.loads(path.read_text())


def _late_lines(manifest: dict) -> dict[str, int]:
    late = Counter()
    for run in manifest.get("runs", []):
        for source, books in run.get("sources", {}).items():
            late[source] += books.get("faults", {}).get("late", 0)
    return dict(late)


def _drops(settings: Settings, flow: str) -> Drops:
    """The rows the stateful operators of ``flow`` dropped, over every run."""
    progress = read_table(settings, "ops.stream_progress")
    if progress.empty:
        return Drops(late=0, duplicates=0)
    ops = progress[(progress["flow"] == flow) & progress["operator"].notna()]
    return Drops(
        late=int(ops["rows_dropped_by_watermark"].fillna(0).sum()),
        duplicates=int(ops["duplicates_dropped"].fillna(0).sum()),
    )


def _lateness(text: str) -> pd.Timedelta:
    return pd.Timedelta(seconds=duration_seconds(text))


def verify_lake(settings: Settings, now: pd.Timestamp | None = None) -> list[Check]:
    """Every check of the lake, in layer order."""
    manifest = _manifest(settings)
    now = now or pd.Timestamp.now(tz="UTC")
    books_mode = any(_late_lines(manifest).values())
    bronze, checks = _bronze_checks(settings)
    late = _found(settings, "silver.late_events")
    events = _events_check(settings, bronze["events"], now, books_mode)
    attribution = _attribution_check(settings, bronze, late, now, books_mode)
    checks += [
        events.check,
        attribution.check,
        _quarantine_check(settings, [*events.quarantined, *attribution.quarantined]),
        late_events_check(settings, late, bronze, books_mode),
        *_gold_over_silver(settings, events, attribution, books_mode),
    ]
    _every_table_checked(checks)
    return checks


@dataclass
class _SilverTable:
    """A silver table verified: its check, its reference rows and the rows found (gold is
    computed over one or the other), and the rows silver.quarantine must hold for it."""

    check: Check
    reference: pd.DataFrame
    found: pd.DataFrame
    quarantined: list[pd.DataFrame]  # columns table, key (the row's id) and rules


def _bronze_checks(settings: Settings) -> tuple[dict[str, pd.DataFrame], list[Check]]:
    """Each bronze table and bronze.quarantine against the landing lines, row for row whatever
    the batches; with the reference bronze rows per source, which silver is computed from."""
    bronze: dict[str, pd.DataFrame] = {}
    quarantine_ref = []
    checks = []
    for source in FIELDS:
        rows, bad = bronze_reference(settings, source)
        bronze[source] = rows
        quarantine_ref.append(bad)
        found = _found(settings, f"bronze.{source}")
        if len(found):
            found["_rescued"] = found["_rescued_data"].notna()
        columns = [*FIELDS[source], "_rescued", "_source_file"]
        checks.append(compare(f"bronze.{source}", rows, found, columns, [ID[source]]))
    quarantine = pd.concat(quarantine_ref, ignore_index=True)
    checks.append(
        compare(
            "bronze.quarantine",
            quarantine,
            _found(settings, "bronze.quarantine"),
            ["source", "reason", "raw", "_source_file"],
            ["source", "_source_file", "raw"],
        )
    )
    return bronze, checks


def _events_check(
    settings: Settings, bronze_events: pd.DataFrame, now: pd.Timestamp, books_mode: bool
) -> _SilverTable:
    """silver.events against bronze.events cleaned, its quality rules applied and the first
    copy of each event kept; with its books, and with late data checked by them."""
    rules = load_rules("events")
    kept, bad = quality(clean_events(bronze_events), rules, now)
    kept = _nanoseconds(kept, "silver.events")
    reference = first_copies(kept, "event_id")
    found = _found(settings, "silver.events")
    check = compare("silver.events", reference, found, list(FIELDS["events"]), ["event_id"])
    drops = _drops(settings, "silver.events")
    _balance_events(settings, check, found, drops)
    if books_mode:
        # rows behind the watermark are dropped as micro-batches fall: none may be invented
        check.books_ok = check.books_ok and len(check.missing) <= drops.late
        check.books.append(
            f"{len(check.missing):,} reference rows missing, {drops.late:,} late rows dropped"
        )
        check.note = "books (late data)"
        check.missing = []
    quarantined = [bad.assign(table="silver.events", key=bad["event_id"])]
    return _SilverTable(check, reference, found, quarantined)


def _balance_events(settings: Settings, check: Check, found: pd.DataFrame, drops: Drops) -> None:
    """The books of silver.events on its check, with or without late data: every bronze row
    is in exactly one of silver.events, silver.quarantine and silver.late_events, or is a
    duplicate of a row silver.events kept; the duplicates and late rows are those the
    stateful operator counted in ops.stream_progress (invariant 1)."""
    found_quarantine = _found(settings, "silver.quarantine")
    found_late = _found(settings, "silver.late_events")
    books = row_books(
        _keys(_found(settings, "bronze.events"), "event_id"),
        _keys(found, "event_id"),
        _record_keys(found_quarantine, "table", "silver.events", "event_id"),
        _record_keys(found_late, "flow", "silver.events", "event_id"),
        drops,
    )
    check.books_ok = books.ok
    check.books.extend(books.lines())


ATTRIBUTION_COLUMNS = [
    "impression_id",
    "ad_id",
    "campaign_id",
    "user_id",
    "impression_time",
    "click_id",
    "click_time",
]
ATTRIBUTION_KEYS = ["impression_id", "click_id"]


def _attribution_check(
    settings: Settings,
    bronze: dict[str, pd.DataFrame],
    late: pd.DataFrame,
    now: pd.Timestamp,
    books_mode: bool,
) -> _SilverTable:
    """silver.ad_attribution against the reference impressions joined to the reference clicks
    (each side with its quality rules applied and the first copy of each id kept); ``late``:
    silver.late_events."""
    sides = {}
    quarantined = []
    for side in ("impressions", "clicks"):
        side_kept, side_bad = quality(bronze[side], load_rules(side), now)
        side_kept = _nanoseconds(side_kept, f"silver.ad_attribution's {side}")
        sides[side] = first_copies(side_kept, ID[side])
        quarantined.append(side_bad.assign(table="silver.ad_attribution", key=side_bad[ID[side]]))
    reference = attribution_reference(sides["impressions"], sides["clicks"], settings)
    found = _found(settings, "silver.ad_attribution")
    check = compare(
        "silver.ad_attribution", reference, found, ATTRIBUTION_COLUMNS, ATTRIBUTION_KEYS
    )
    if books_mode:
        rows = _late_rows(late, "silver.ad_attribution")
        late_ids = {
            side: {key for key, _ in _late_keys(rows, side)} for side in ("impressions", "clicks")
        }
        _attribution_books(check, reference, found, sides["impressions"], late_ids)
    return _SilverTable(check, reference, found, quarantined)


def _attribution_books(
    check: Check,
    reference: pd.DataFrame,
    found: pd.DataFrame,
    impressions: pd.DataFrame,
    late_ids: dict[str, set[str]],
) -> None:
    """silver.ad_attribution with late data: a late click dropped leaves its impression
    unmatched and a late impression is missing, so only the matched pairs are compared: a
    reference pair may be missing only when its impression or its click is one of the flow's
    rows kept in silver.late_events (``late_ids``, per side), and every impression found must
    be one of the reference ``impressions``."""
    matched = found[found["click_id"].notna()] if len(found) else found
    pairs = compare(
        "silver.ad_attribution",
        reference[reference["click_id"].notna()],
        matched,
        ATTRIBUTION_COLUMNS,
        ATTRIBUTION_KEYS,
    )
    check.unexpected, check.differing = pairs.unexpected, pairs.differing
    at = {c: ATTRIBUTION_COLUMNS.index(c) for c in ATTRIBUTION_KEYS}
    check.missing = [
        row
        for row in pairs.missing
        if str(row[at["impression_id"]]).strip(" ") not in late_ids["impressions"]
        and str(row[at["click_id"]]).strip(" ") not in late_ids["clicks"]
    ]
    explained = len(pairs.missing) - len(check.missing)
    unknown = set(found.get("impression_id", [])) - set(impressions["impression_id"])
    check.books_ok = not unknown
    check.books.append(
        f"{len(unknown):,} impressions not in the reference; matched pairs compared, "
        f"{explained:,} missing with a side kept in silver.late_events"
    )
    check.note = "books (late data)"


def _quarantine_check(settings: Settings, expected: list[pd.DataFrame]) -> Check:
    """silver.quarantine: what each flow quarantined (``expected``), by the rules broken."""
    expected_q = pd.concat([f[["table", "key", "rules"]] for f in expected], ignore_index=True)
    found_q = _found(settings, "silver.quarantine")
    if len(found_q):
        records = found_q["record"].map(json.loads)
        found_q = found_q.assign(
            key=[
                r.get("event_id")
                if t == "silver.events"
                else r.get("click_id", r.get("impression_id"))
                for r, t in zip(records, found_q["table"], strict=True)
            ],
            rules=found_q["rules"].map(lambda names: tuple(sorted(names))),
        )
    return compare(
        "silver.quarantine", expected_q, found_q, ["table", "key", "rules"], ["table", "key"]
    )


def _gold_over_silver(
    settings: Settings, events: _SilverTable, attribution: _SilverTable, books_mode: bool
) -> list[Check]:
    """The gold checks: over the reference silver, or over the silver found when late rows
    were dropped, and then their differences shown but not failed."""
    if books_mode:
        # (a silver table not written yet: no rows, with its columns)
        events_found, attribution_found = (
            table.found if len(table.found.columns) else table.reference.iloc[0:0]
            for table in (events, attribution)
        )
        gold = gold_checks(
            settings, events_found, attribution_found, "over the silver tables found"
        )
    else:
        gold = gold_checks(settings, events.reference, attribution.reference, "")
    _same_sessions(settings, gold)
    if books_mode:
        # rows silver kept can still be behind a gold flow's own watermark in the micro-batch
        # that brings them, and then that flow drops them: gold depends on the batches too
        late_in_gold = sum(_drops(settings, flow).late for flow in _gold_flows())
        for check in gold:
            check.tolerated = f"late data: gold flows dropped {late_in_gold:,} late rows"
    return gold


SESSION_COLUMNS = ["user_id", "session_start", "session_end", "events", "purchases", "revenue"]


def session_tables(settings: Settings) -> Check:
    """gold.sessions_custom against gold.sessions (the expected side), row by row over
    SESSION_COLUMNS, floats as close as :func:`compare` allows (the two sum a session's
    revenue in different orders)."""
    sessions = _found(settings, "gold.sessions")
    return compare(
        "gold.sessions_custom",
        sessions if len(sessions) else pd.DataFrame(columns=SESSION_COLUMNS),
        _found(settings, "gold.sessions_custom"),
        SESSION_COLUMNS,
        ["user_id", "session_start"],
    )


def _same_sessions(settings: Settings, checks: list[Check]) -> None:
    """gold.sessions and gold.sessions_custom must hold the same sessions after every run
    (both write a session in the micro-batch whose watermark closes it): a books line on
    gold.sessions_custom's check."""
    custom = next((c for c in checks if c.table == "gold.sessions_custom"), None)
    if custom is None:
        return
    pair = session_tables(settings)
    apart = pair.apart
    custom.books_ok = custom.books_ok and not apart
    custom.books.append(
        f"{pair.found:,} sessions, the same as gold.sessions'"
        if not apart
        else f"{apart:,} sessions differ from gold.sessions' ({pair.expected:,} there, "
        f"{pair.found:,} here), e.g. {(pair.missing or pair.unexpected or pair.differing)[0]}"
    )


def _every_table_checked(checks: list[Check]) -> None:
    """Fail when a declared table has no check: gold tables get theirs from the declarations,
    bronze and silver ones from the code above, which a new table there must extend (without
    this, verify would report "all tables equal" and never look at it)."""
    from lakehouse.runner import declared_tables

    unchecked = sorted(set(declared_tables()) - {check.table for check in checks})
    if unchecked:
        raise VerifyError(f"verify has no check for the declared table(s) {', '.join(unchecked)}")


def _gold_flows() -> list[str]:
    """The gold flows recorded in ops.stream_progress (by name: gold.<flow>)."""
    from lakehouse.runner import pipeline

    return [flow.name for flow in pipeline().layer("gold")]


def reference_silver(
    settings: Settings, events: pd.DataFrame, attribution: pd.DataFrame
) -> oracle.Silver:
    """The silver tables the gold references are computed from, with the settings they use."""
    return oracle.Silver(
        events,
        attribution,
        events_lateness=_lateness(settings.watermarks.events),
        attribution_lateness=_lateness(settings.watermarks.attribution),
        session_max_pages=settings.gold.session_max_pages,
    )


def gold_checks(
    settings: Settings, events: pd.DataFrame, attribution: pd.DataFrame, note: str = ""
) -> list[Check]:
    """Each gold table the flows declare, against its declared reference over ``events`` and
    ``attribution``."""
    from lakehouse.runner import pipeline

    silver = reference_silver(settings, events, attribution)
    checks = []
    for output in (o for flow in pipeline().layer("gold") for o in flow.outputs):
        ref = output.reference
        if ref is None:
            raise VerifyError(f"{output.table} declares no reference: it cannot be verified")
        expected = ref.rows(silver)
        checks.append(
            compare(
                output.table,
                expected,
                _found(settings, output.table),
                list(ref.columns or expected.columns),
                list(ref.keys),
                "; ".join(n for n in (note, ref.note) if n),
            )
        )
    return checks


def print_checks(checks: list[Check], out: TextIO) -> None:
    header = ["table", "expected", "found", "missing", "unexpected", "differing", "", "compared"]
    rows = [
        [
            c.table,
            f"{c.expected:,}",
            f"{c.found:,}",
            f"{len(c.missing):,}",
            f"{len(c.unexpected):,}",
            f"{len(c.differing):,}",
            c.status,
            c.note or "row for row",
        ]
        for c in checks
    ]
    for line in aligned(header, rows, right={1, 2, 3, 4, 5}):
        print(line, file=out)
    print(f"  {TOLERANCE_NOTE}", file=out)  # (indented: a note, not a table's line)
    for c in checks:
        for line in c.books:
            print(f"  {c.table} books: {line}", file=out)
        if c.tolerated and not c.same:
            print(f"  {c.table}: {c.tolerated}; the differences are shown, not failed", file=out)
        if c.same:
            continue
        names = ", ".join(c.columns)
        for kind, rows in (("missing", c.missing), ("unexpected", c.unexpected)):
            for row in rows[:EXAMPLES]:
                print(f"  {c.table} {kind}: ({names}) = {row}", file=out)
        for want, have in c.differing[:EXAMPLES]:
            print(f"  {c.table} differing: expected {want}, found {have}", file=out)


def run_verify(settings: Settings, out: TextIO | None = None, now=None) -> int:
    out = out or sys.stdout
    checks = verify_lake(settings, now)
    print_checks(checks, out)
    bad = [c.table for c in checks if not c.ok]
    if bad:
        print(f"verify: {len(bad)} table(s) differ from the reference: {', '.join(bad)}", file=out)
        return 1
    late = [c.table for c in checks if not c.same]
    if late:
        print(
            f"verify: the books balance; {len(late)} table(s) differ only where late rows were "
            f"dropped: {', '.join(late)}{_empty_note(checks)}",
            file=out,
        )
    else:
        print(all_equal_line(checks), file=out)
    return 0


def all_equal_line(checks: list[Check]) -> str:
    """verify's last line when every table equals its reference: it names the tables that
    are equal only because both sides are empty."""
    return f"verify: all {len(checks)} tables equal the reference{_empty_note(checks, 'them')}"


def _empty_note(checks: list[Check], of: str = "the tables") -> str:
    """The tables equal only because both sides are empty, as the end of verify's last line."""
    empty = [c.table for c in checks if c.empty]
    if not empty:
        return ""
    return f"; {len(empty)} of {of} empty on both sides, nothing compared: {', '.join(empty)}"


__all__ = ["Check", "VerifyError", "compare", "run_verify", "verify_lake"]
