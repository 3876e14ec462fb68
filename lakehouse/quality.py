"""Quality rules as data: one declaration per rule gives the row-level predicate that splits a
micro-batch (kept, quarantined, or failing the query) and the great-expectations expectation
that reports on it.

Rules live beside the table they guard (``silver/rules/<table>.toml``), one ``[[rule]]`` each::

    [[rule]]
    name = "event_type_known"        # unique in the file; quarantine rows carry it
    check = "in_set"                 # not_null | null | in_set | between | regex | not_after_now
    column = "event_type"
    values = ["page_view", "search", "add_to_cart", "purchase"]
    when = "event_type IS NOT NULL"  # optional SQL condition: the rule applies to these rows
    action = "drop"                  # warn (record only) | drop (to quarantine) | fail (stop)

Semantics follow great-expectations: a rule applies to the rows its ``when`` condition holds for
(all rows without one); ``in_set``, ``between``, ``regex`` and ``not_after_now`` pass a null
value (use ``not_null`` for presence). ``not_after_now`` takes ``within`` (a duration): the value
may be at most that far after the time the micro-batch is validated.
"""

from __future__ import annotations

import datetime as dt
import re
import threading
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lakehouse.errors import LakehouseError
from lakehouse.settings import duration_seconds

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column, DataFrame

CHECKS = ("not_null", "null", "in_set", "between", "regex", "not_after_now")
PRESENCE = ("not_null", "null")  # the checks that look at whether a value is there, not at it
ACTIONS = ("warn", "drop", "fail")
FAILED = "_failed_rules"  # array of the names of the rules a row breaks


class RuleError(LakehouseError, ValueError):
    """A rules file that cannot be used."""


class QualityFailure(LakehouseError, RuntimeError):
    """A ``fail`` rule found rows that break it: the run failed (exit code 1)."""

    exit_code = 1

    def __init__(self, rule: str, table: str, count: int):
        self.rule, self.table, self.count = rule, table, count
        super().__init__(
            f"quality rule {rule} (action fail) on {table}: {count} row(s) break it; fix the "
            "input or change the rule's action in its rules file"
        )


@dataclass(frozen=True)
class Rule:
    name: str
    check: str
    column: str
    action: str
    values: tuple[Any, ...] = ()
    min: Any = None
    max: Any = None
    pattern: str | None = None
    within: str | None = None
    when: str | None = None

    def applies(self) -> Column:
        """Rows the rule is about (its ``when`` condition; a null condition does not hold)."""
        from pyspark.sql import functions as F

        return F.coalesce(F.expr(self.when), F.lit(False)) if self.when else F.lit(True)

    def check_column(self, now: Column | dt.datetime | None = None) -> Column:
        """True where the value is acceptable (null where great-expectations skips it).
        ``now`` defaults to the micro-batch's timestamp."""
        from pyspark.sql import functions as F

        now_col = (
            F.current_timestamp()
            if now is None
            else F.lit(now)
            if isinstance(now, dt.datetime)
            else now
        )

        col = F.col(self.column)
        if self.check == "not_null":
            return col.isNotNull()
        if self.check == "null":
            return col.isNull()
        if self.check == "in_set":
            return col.isin(*self.values)
        if self.check == "regex":
            return col.rlike(self.pattern)
        if self.check == "between":
            cond = F.lit(True)
            if self.min is not None:
                cond = cond & (col >= F.lit(self.min))
            if self.max is not None:
                cond = cond & (col <= F.lit(self.max))
            return cond
        if self.check == "not_after_now":
            ahead = duration_seconds(self.within or "0 seconds")
            return col <= now_col + F.make_interval(secs=F.lit(ahead))
        raise RuleError(f"rule {self.name}: unknown check {self.check}")

    def latest(self, now: dt.datetime) -> dt.datetime:
        return now + dt.timedelta(seconds=duration_seconds(self.within or "0 seconds"))

    def passes(self, now: Column | dt.datetime | None = None) -> Column:
        """True for every row that does not break the rule (never null)."""
        from pyspark.sql import functions as F

        return ~self.applies() | F.coalesce(self.check_column(now), F.lit(True))


def load_rules(path: str | Path | Traversable) -> tuple[Rule, ...]:
    """Read and check a rules file (a path, or package data from importlib.resources); a
    mistake names the rule and the key."""
    if isinstance(path, str):
        path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise RuleError(f"no rules file at {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise RuleError(f"{path} is not valid TOML: {exc}") from None
    rules = []
    seen: set[str] = set()
    for i, raw in enumerate(data.get("rule", [])):
        where = f"{path.name} rule {i + 1}"
        raw = dict(raw)
        for key in ("name", "check", "column", "action"):
            if not raw.get(key):
                raise RuleError(f"{where}: '{key}' is required")
        where = f"{path.name} rule {raw['name']}"
        if raw["name"] in seen:
            raise RuleError(f"{where}: the name is used twice")
        seen.add(raw["name"])
        if raw["check"] not in CHECKS:
            raise RuleError(f"{where}: check must be one of {', '.join(CHECKS)}")
        if raw["action"] not in ACTIONS:
            raise RuleError(f"{where}: action must be one of {', '.join(ACTIONS)}")
        needs = {"in_set": "values", "regex": "pattern", "not_after_now": "within"}
        if raw["check"] in needs and raw.get(needs[raw["check"]]) in (None, "", []):
            raise RuleError(f"{where}: check {raw['check']} needs '{needs[raw['check']]}'")
        if raw["check"] == "between" and raw.get("min") is None and raw.get("max") is None:
            raise RuleError(f"{where}: check between needs 'min', 'max' or both")
        unknown = set(raw) - {f for f in Rule.__dataclass_fields__}
        if unknown:
            raise RuleError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
        if raw.get("within"):
            duration_seconds(raw["within"])
        if raw["check"] == "regex":
            try:  # small batches' great-expectations report matches it with Python's engine
                re.compile(raw["pattern"])
            except re.error as exc:
                raise RuleError(
                    f"{where}: pattern is not a regex Python can read ({exc})"
                ) from None
        raw["values"] = tuple(raw.get("values", ()))
        rules.append(Rule(**raw))
    if not rules:
        raise RuleError(f"{path} declares no [[rule]]")
    return tuple(rules)


def flag(df: DataFrame, rules: Sequence[Rule], now: dt.datetime | None = None) -> DataFrame:
    """Add ``_failed_rules``: the names of the rules each row breaks (empty when none)."""
    from pyspark.sql import functions as F

    if not rules:  # typed, so that a flow without rules still writes its quarantine schema
        return df.withColumn(FAILED, F.array().cast("array<string>"))
    broken = [F.when(~r.passes(now), F.lit(r.name)) for r in rules]
    return df.withColumn(FAILED, F.filter(F.array(*broken), lambda n: n.isNotNull()))


def dropped(rules: Sequence[Rule]) -> Column:
    """True for a flagged row that breaks a ``drop`` rule (it goes to quarantine)."""
    from pyspark.sql import functions as F

    names = [r.name for r in rules if r.action == "drop"]
    if not names:
        return F.lit(False)
    return F.arrays_overlap(F.col(FAILED), F.array(*[F.lit(n) for n in names]))


def enforce_fail_rules(flagged: DataFrame, rules: Sequence[Rule], table: str) -> None:
    """Raise :class:`QualityFailure` when a flagged batch breaks a ``fail`` rule."""
    from pyspark.sql import functions as F

    fail = [r.name for r in rules if r.action == "fail"]
    if not fail:
        return
    counts = (
        flagged.select(F.explode(FAILED).alias("rule"))
        .where(F.col("rule").isin(fail))
        .groupBy("rule")
        .count()
        .collect()
    )
    if counts:
        worst = sorted(counts, key=lambda r: (-r["count"], r["rule"]))[0]
        raise QualityFailure(worst["rule"], table, worst["count"])


# --------------------------------------------------------------------------------------------
# great-expectations: the suite-level results of every micro-batch

RESULTS_TABLE = "ops.quality_results"
# per table and engine, a great-expectations batch definition in an ephemeral context of its
# own: validations of different tables (flows) run at once without sharing one
_GX: dict[str, Any] = {}
_GX_CREATE = threading.Lock()  # held only while a context and its data source are created


def results_schema() -> pa.Schema:
    """ops.quality_results' columns: one row per rule and validated micro-batch."""
    import pyarrow as pa

    return pa.schema(
        [
            ("table", pa.string()),
            ("batch_id", pa.int64()),
            ("validated_at", pa.timestamp("us", tz="UTC")),
            ("rule", pa.string()),
            ("action", pa.string()),
            ("expectation", pa.string()),
            ("column", pa.string()),
            ("success", pa.bool_()),
            ("element_count", pa.int64()),
            ("unexpected_count", pa.int64()),
            ("unexpected_percent", pa.float64()),
            ("error", pa.string()),
        ]
    )


def _batch_definition(table: str, engine: str):
    """A great-expectations context and batch definition for ``table`` on ``engine``
    (``pandas``, or ``spark`` to compare with it), ephemeral and of its own: no files, no
    data docs, no progress bars; on Spark the app's session is reused (GX would restart a
    session it cannot configure, so it is given no Spark settings)."""
    key = f"{engine}:{table}"
    with _GX_CREATE:
        if key not in _GX:
            _GX[key] = _new_batch_definition(table, engine)
        return _GX[key]


def _new_batch_definition(table: str, engine: str):
    import logging
    import warnings

    logging.getLogger("great_expectations").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", module="great_expectations")
    import great_expectations as gx
    from great_expectations.data_context.types.base import (
        DataContextConfig,
        InMemoryStoreBackendDefaults,
        ProgressBarsConfig,
    )

    context = gx.get_context(
        mode="ephemeral",
        project_config=DataContextConfig(
            store_backend_defaults=InMemoryStoreBackendDefaults(init_temp_docs_sites=False),
            progress_bars=ProgressBarsConfig(globally=False),
            analytics_enabled=False,
        ),
    )
    name = f"lake-{engine}-{table}"
    if engine == "spark":
        source = context.data_sources.add_spark(name=name, persist=False)
    else:
        source = context.data_sources.add_pandas(name=name)
    definition = source.add_dataframe_asset(name=table).add_batch_definition_whole_dataframe(
        name="micro_batch"
    )
    return context, definition


def expectation(
    rule: Rule, now: dt.datetime, engine: str = "spark", when_column: str | None = None
):
    """The great-expectations expectation of a rule (the same semantics as its predicate). On
    the ``pandas`` engine, Spark evaluated the rule's ``when`` condition into the boolean column
    ``when_column``, and times are naive UTC, as :func:`_pandas` gives them."""
    import great_expectations.expectations as gxe

    kwargs: dict[str, Any] = {"column": rule.column, "meta": {"rule": rule.name}}
    if rule.when and engine == "pandas":
        kwargs.update(row_condition=f"{when_column} == True", condition_parser="pandas")
    elif rule.when:
        kwargs.update(row_condition=rule.when, condition_parser="spark")
    bound = _naive_utc if engine == "pandas" else (lambda value: value)
    if rule.check == "not_null":
        return gxe.ExpectColumnValuesToNotBeNull(**kwargs)
    if rule.check == "null":
        return gxe.ExpectColumnValuesToBeNull(**kwargs)
    if rule.check == "in_set":
        return gxe.ExpectColumnValuesToBeInSet(value_set=list(rule.values), **kwargs)
    if rule.check == "regex":
        return gxe.ExpectColumnValuesToMatchRegex(regex=rule.pattern, **kwargs)
    if rule.check == "between":
        return gxe.ExpectColumnValuesToBeBetween(
            min_value=bound(rule.min), max_value=bound(rule.max), **kwargs
        )
    if rule.check == "not_after_now":
        return gxe.ExpectColumnValuesToBeBetween(max_value=bound(rule.latest(now)), **kwargs)
    raise RuleError(f"rule {rule.name}: unknown check {rule.check}")


def _naive_utc(value: Any) -> Any:
    """A time-zone aware datetime as naive UTC (pandas compares naive times with naive only)."""
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value.astimezone(dt.UTC).replace(tzinfo=None)
    return value


# Micro-batches of up to this many rows are validated by great-expectations' pandas engine,
# larger ones by its Spark engine, on the cached batch. GX on Spark runs a Spark job per metric
# domain: about 2 s whatever the size (2.1 s for 2,000 rows of silver.events, 1.4 s for
# 300,000, 2.8 s for 1,000,000), where pandas takes 0.6 s for 2,000 rows with the collect and
# grows with them (1.5 s for 100,000, 3 s for 300,000, 9 to 15 s and 8 to 10 s of the
# driver's CPU for 1,000,000): the engines cost the same near 150,000 rows.
PANDAS_MAX_ROWS = 100_000


def validate(
    batch: DataFrame,
    rules: Sequence[Rule],
    table: str,
    batch_id: int,
    pandas_max_rows: int = PANDAS_MAX_ROWS,
    at_most: int | None = None,
) -> pa.Table | None:
    """Validate a (cached) micro-batch with great-expectations: one result row per rule, or
    None for a batch of no rows. Up to ``pandas_max_rows`` rows on GX's pandas engine (Spark
    collects the columns the rules read, with their ``when`` conditions evaluated; a column
    only checked for presence travels as its presence), more on its Spark engine. ``at_most``:
    a bound on the batch's rows known to the caller; within ``pandas_max_rows``, the batch is
    not counted first (on a small micro-batch the count took as long as the rest: a job of
    two stages)."""
    from pyspark.sql import functions as F

    now = dt.datetime.now(dt.UTC)
    if at_most is not None and at_most <= pandas_max_rows:
        engine = "pandas"
    else:
        rows = batch.count()
        if not rows:
            return None
        engine = "pandas" if rows <= pandas_max_rows else "spark"
    _context, definition = _batch_definition(table, engine)
    if engine == "spark":
        suite = gx_suite(rules, now, table, engine, batch.columns)
        return _results(rules, table, batch_id, now, _report(definition, suite, batch))
    when = _when_columns(rules, batch.columns)
    presence = {r.column for r in rules} - {r.column for r in rules if r.check not in PRESENCE}
    columns = [
        F.when(F.col(c).isNotNull(), F.lit(True)).alias(c) if c in presence else F.col(c)
        for c in dict.fromkeys(r.column for r in rules)
    ]
    conditions = [r.applies().alias(when[r.name]) for r in rules if r.when]
    data = _pandas(batch.select(*columns, *conditions))
    if data.empty:  # (a batch the caller did not count)
        return None
    suite = gx_suite(rules, now, table, engine, batch.columns)
    return _results(rules, table, batch_id, now, _report(definition, suite, data))


def gx_suite(rules: Sequence[Rule], now: dt.datetime, table: str, engine: str, columns):
    """The expectation suite of ``rules`` (each expectation names its rule in ``meta``)."""
    import great_expectations as gx

    when = _when_columns(rules, columns)
    suite = gx.ExpectationSuite(name=f"{table}-rules")
    for rule in rules:
        suite.add_expectation(expectation(rule, now, engine, when.get(rule.name)))
    return suite


def _report(definition, suite, data):
    """GX's validation of a batch (a pandas frame, or a Spark DataFrame)."""
    batch = definition.get_batch(batch_parameters={"dataframe": data})
    return batch.validate(
        suite, result_format={"result_format": "BASIC", "partial_unexpected_count": 0}
    )


def _results(rules, table, batch_id, now, report) -> pa.Table:
    """One ops.quality_results row per rule from GX's report of a batch."""
    import pyarrow as pa

    by_name = {r.name: r for r in rules}
    rows = []
    for result in report.results:  # matched by name: failed metrics come first
        config, out = result.expectation_config, (result.result or {})
        rule = by_name[config.meta["rule"]]
        percent = out.get("unexpected_percent")
        rows.append(
            {"table": table, "batch_id": batch_id, "validated_at": now, "rule": rule.name,
             "action": rule.action, "expectation": config.type, "column": rule.column,
             "success": bool(result.success), "element_count": out.get("element_count"),
             "unexpected_count": out.get("unexpected_count"),
             "unexpected_percent": None if percent is None else float(percent),
             "error": _error(result)}
        )  # fmt: skip
    return pa.Table.from_pylist(rows, results_schema())


def check_batch(
    parts: Sequence[tuple[DataFrame, DataFrame, Sequence[Rule]]],
    table: str,
    batch_id: int,
    batch_rows: int | None = None,
):
    """A silver flow's ``before_write``: per part of a micro-batch (kept rows, every input row,
    rules), the fail rules on the kept rows, before anything is written; then, in the
    background while the batch is written, great-expectations' results on every input row,
    kept or quarantined (none for parts without rows: a no-data batch only moves the
    watermark), as side rows for ops.quality_results (Arrow: appended without a Spark job).
    ``batch_rows``: the micro-batch's rows, which no part exceeds (see :func:`validate`)."""
    import pyarrow as pa

    from lakehouse.flows import in_background

    for kept, _rows, rules in parts:
        enforce_fail_rules(kept, rules, table)

    def results() -> pa.Table | None:
        found = [
            validate(rows, rules, table, batch_id, at_most=batch_rows)
            for _kept, rows, rules in parts
        ]
        found = [f for f in found if f is not None]
        return pa.concat_tables(found) if found else None

    return {RESULTS_TABLE: in_background(results)}


def _pandas(df: DataFrame):
    """``df`` collected as pandas through Arrow, times as naive UTC in microseconds: a time
    Spark holds (years 1 to 9999) fits, where ``toPandas``' nanoseconds fail outside 1678-2261
    (such a row is then quarantined by a rule, not a crash of the flow)."""
    import pandas as pd

    data = df.toArrow().to_pandas(coerce_temporal_nanoseconds=False)
    for name in data.columns:
        if isinstance(data[name].dtype, pd.DatetimeTZDtype):
            data[name] = data[name].dt.tz_convert("UTC").dt.tz_localize(None)
    return data


def _when_columns(rules: Sequence[Rule], taken: Sequence[str]) -> dict[str, str]:
    """Names, not among ``taken``, for the columns holding the rules' ``when`` conditions."""
    prefix = "gx_when"
    while any(c.startswith(prefix) for c in taken):
        prefix += "_"
    return {r.name: f"{prefix}_{i}" for i, r in enumerate(rules) if r.when}


def _error(result) -> str | None:
    info = result.exception_info or {}
    if info.get("raised_exception"):
        return info.get("exception_message")
    messages = {
        getattr(v, "exception_message", None)
        for v in info.values()
        if getattr(v, "raised_exception", False)
    }
    return "; ".join(sorted(m for m in messages if m)) or None
