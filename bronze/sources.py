"""Bronze: landing JSON lines to typed rows, or to quarantine with a reason.

Every line of a landing file becomes exactly one row: a typed row of ``bronze.<source>`` when it
is a JSON object with every required field present and well typed, else a row of
``bronze.quarantine`` with the raw text and the reason. Fields the schema does not know, and known
fields whose value has the wrong JSON type, are kept as JSON in ``_rescued_data``, so nothing a
producer sent is lost even when the row itself is kept.

Schemas are explicit (docs/architecture.md 7): nothing is inferred at run time.
"""

from __future__ import annotations

from functools import partial

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from lakehouse.contract import EVENT_TIME, REQUIRED, SOURCES
from lakehouse.flows import Flow, LandingInput, Output


def _schema(*fields: tuple[str, object]) -> StructType:
    return StructType([StructField(name, typ, True) for name, typ in fields])


SCHEMAS: dict[str, StructType] = {
    "events": _schema(
        ("event_id", StringType()),
        ("user_id", LongType()),
        ("event_type", StringType()),
        ("page", StringType()),
        ("amount", DoubleType()),
        ("event_time", TimestampType()),
        ("device", StringType()),
        ("country", StringType()),
    ),
    "impressions": _schema(
        ("impression_id", StringType()),
        ("ad_id", LongType()),
        ("campaign_id", LongType()),
        ("user_id", LongType()),
        ("impression_time", TimestampType()),
    ),
    "clicks": _schema(
        ("click_id", StringType()),
        ("impression_id", StringType()),
        ("ad_id", LongType()),
        ("user_id", LongType()),
        ("click_time", TimestampType()),
    ),
}
RESCUED = "_rescued_data"
# Spark's JSON parser takes single-quoted names and strings by default; JSON (and the verify
# reference) does not. (NaN and Infinity stay allowed: Python's json module reads them too.)
STRICT_JSON = {"allowSingleQuotes": "false"}
METADATA = _schema(
    (RESCUED, StringType()), ("_source_file", StringType()), ("_ingested_at", TimestampType())
)
QUARANTINE_TABLE = "bronze.quarantine"
QUARANTINE_SCHEMA = _schema(
    ("source", StringType()),
    ("raw", StringType()),
    ("reason", StringType()),
    ("detail", StringType()),
    ("_source_file", StringType()),
    ("_ingested_at", TimestampType()),
)
# Reasons a line goes to quarantine, checked in this order.
REASONS = (
    "too_large",
    "invalid_utf8",
    "empty_line",
    "malformed_json",
    "repeated_key",
    "missing_field",
    "wrong_type",
)
BOM = "\ufeff"  # a byte-order mark that starts a line (a file's first) is dropped
# a record this large is no event: kept whole in quarantine, never parsed into a bronze row
# (settings bronze.max_record_bytes)
MAX_RECORD_BYTES = 1_000_000


def table_schema(source: str) -> StructType:
    """The schema of ``bronze.<source>``: the source's fields, then the bronze metadata."""
    return StructType(SCHEMAS[source].fields + METADATA.fields)


def _field_value(raw: Column, name: str, typ) -> Column:
    """The typed value of field ``name`` from its JSON text (null when absent or not
    convertible). A number sent as a JSON string converts when its text is an exact number."""
    text = F.element_at(raw, F.lit(name))
    if isinstance(typ, StringType):
        return text
    return text.try_cast(typ)


def parse_lines(lines: DataFrame, source: str, max_bytes: int = MAX_RECORD_BYTES) -> DataFrame:
    """Parse the ``value`` lines of ``source`` (with ``_source_file``) into typed columns, the
    rescued data, and ``_reason``/``_detail`` (null for a row that belongs in bronze). A line
    of more than ``max_bytes`` bytes goes to quarantine whole, unparsed (``too_large``).

    Each line is parsed once, as a map from field name to JSON text; typed values are conversions
    of those texts, so a field that is absent is told apart from one that has the wrong type,
    and fields the schema does not know are found without a second parse. The conditions are
    plain expressions (no lambdas) so Spark compiles them; the rescued-data JSON is built only
    for the rare line that has something to rescue.
    """
    schema = SCHEMAS[source]
    lines = lines.withColumn(
        "value",
        F.when(F.col("value").startswith(BOM), F.substring("value", 2, 2**31 - 1)).otherwise(
            F.col("value")
        ),
    )
    # rand() makes the parse nondeterministic to the optimizer, which then neither copies it
    # into every expression that reads it nor pushes a filter below it: one parse per line.
    parse = F.when(F.rand(0) >= 0, F.from_json("value", "map<string,string>", STRICT_JSON))
    utf8 = F.is_valid_utf8("value")
    parsed = lines.select("value", "_source_file", parse.alias("_raw"), utf8.alias("_utf8"))
    fields = _Fields(F.col("_raw"), schema)
    reason, detail = _oddity(fields, REQUIRED[source], max_bytes)
    return parsed.select(
        # kept for quarantine only; valid UTF-8, as a Parquet string must be
        F.when(reason.isNotNull(), F.make_valid_utf8("value")).alias("value"),
        *[fields.typed[f.name].alias(f.name) for f in schema.fields],
        fields.rescued.alias(RESCUED),
        "_source_file",
        F.current_timestamp().alias("_ingested_at"),
        reason.alias("_reason"),
        detail.alias("_detail"),
    )


class _Fields:
    """What a parsed line (``raw``: field name to JSON text) holds of ``schema``'s fields:
    each typed, present, mistyped (there, but not converting: a string field takes any JSON
    scalar), unknown keys or a key repeated, and the rescued data."""

    def __init__(self, raw: Column, schema: StructType):
        self.raw = raw
        self.typed = {f.name: _field_value(raw, f.name, f.dataType) for f in schema.fields}
        self.present = {f.name: F.element_at(raw, F.lit(f.name)).isNotNull() for f in schema.fields}
        self.mistyped = {
            f.name: self.present[f.name] & self.typed[f.name].isNull()
            for f in schema.fields
            if not isinstance(f.dataType, StringType)
        }
        known_keys = sum(
            (F.map_contains_key(raw, F.lit(f.name)).cast("int") for f in schema.fields), F.lit(0)
        )
        # more entries than known keys: unknown keys, or a key repeated (the map keeps both)
        has_unknown = F.size(raw) > known_keys
        keys = F.map_keys(raw)
        self.repeated = F.when(has_unknown, F.size(F.array_distinct(keys)) < F.size(raw)).otherwise(
            F.lit(False)
        )
        self.repeated_names = F.array_distinct(
            F.filter(keys, lambda k: F.size(F.filter(keys, lambda other: other == k)) > 1)
        )
        known = F.array(*[F.lit(f.name) for f in schema.fields])
        bad_names = F.array(*[F.when(bad, F.lit(name)) for name, bad in self.mistyped.items()])
        rescued = F.map_filter(
            raw,
            lambda k, _v: (
                ~F.array_contains(known, k)
                | F.coalesce(F.array_contains(bad_names, k), F.lit(False))
            ),
        )
        self.rescued = F.when(
            has_unknown | _any(list(self.mistyped.values())),
            F.when(F.size(rescued) > 0, F.to_json(rescued)),
        )


def _oddity(fields: _Fields, required: tuple[str, ...], max_bytes: int) -> tuple[Column, Column]:
    """The quarantine reason of a line (in the order of :data:`REASONS`; null: none) and its
    detail, over the parsed line's ``value``, ``_utf8`` and ``fields``."""
    raw, value = fields.raw, F.col("value")
    missing = [~fields.present[name] for name in required]
    wrong = [fields.mistyped[name] for name in required if name in fields.mistyped]
    wrong_all = list(fields.mistyped.values())
    # (the checks are ordered so the common line pays only for cheap ones: CASE WHEN
    # evaluates a branch only when its condition holds)
    # a blank line, or a Kafka record without a value (null)
    blank = F.when(raw.isNull(), F.coalesce(value.rlike(r"^\s*$"), F.lit(True))).otherwise(
        F.lit(False)
    )
    # Spark's JSON parser stops after the first value: text after the object (a stray "}", a
    # second object from a producer that forgot a newline, with or without a comma) must not
    # pass for a good line. A line whose first "}" is its last character has none; the others
    # (rare: a nested object, a "}" in a string) are parsed again as the only element of an
    # array, which holds exactly one value when nothing follows the object.
    inner_brace = F.instr(value, "}") < F.length(value)
    as_array = F.from_json(F.concat(F.lit("["), value, F.lit("]")), "array<string>", STRICT_JSON)
    trailing = F.when(
        raw.isNotNull() & inner_brace,
        ~F.rtrim(value).endswith("}") | F.coalesce(F.size(as_array) != 1, F.lit(True)),
    ).otherwise(F.lit(False))
    not_object = raw.isNull() | trailing
    not_utf8 = ~F.col("_utf8")
    size = F.octet_length(value)
    too_large = F.coalesce(size > max_bytes, F.lit(False))
    reason = (
        F.when(too_large, "too_large")
        .when(not_utf8, "invalid_utf8")
        .when(blank, "empty_line")
        .when(not_object, "malformed_json")
        .when(fields.repeated, "repeated_key")
        .when(_any(missing), "missing_field")
        .when(_any(wrong), "wrong_type")
    )
    # the bytes of a line that is not UTF-8, in base64 (raw holds it with U+FFFD in their place)
    original = F.regexp_replace(F.base64(value.cast("binary")), r"\s", "")
    detail = (
        F.when(
            too_large,
            F.concat(F.format_number(size, 0), F.lit(f" bytes, over the limit of {max_bytes:,}")),
        )
        .when(not_utf8, F.concat(F.lit("not UTF-8; its bytes in base64: "), original))
        .when(blank, F.when(value.isNull(), F.lit("null value")).otherwise(F.lit("blank line")))
        .when(raw.isNull(), F.lit("not a JSON object"))
        .when(trailing, F.lit("text after the JSON object"))
        .when(
            fields.repeated,
            F.concat(F.lit("repeated key: "), F.array_join(fields.repeated_names, ", ")),
        )
        .when(_any(missing), F.concat(F.lit("missing: "), _named(list(required), missing)))
        .when(
            _any(wrong),
            F.concat(F.lit("wrong type: "), _named(list(fields.mistyped), wrong_all)),
        )
    )
    return reason, detail


def _any(conditions: list[Column]) -> Column:
    out = F.lit(False)
    for cond in conditions:
        out = out | cond
    return out


def _named(names, conditions) -> Column:
    """The names whose condition holds, joined by commas."""
    return F.concat_ws(", ", *[F.when(c, F.lit(n)) for n, c in zip(names, conditions, strict=True)])


def bronze_rows(parsed: DataFrame, source: str) -> DataFrame:
    """The rows of ``bronze.<source>``: every line with no quarantine reason."""
    return parsed.where(F.col("_reason").isNull()).select(*table_schema(source).names)


def quarantine_rows(parsed: DataFrame, source: str) -> DataFrame:
    """The rows of ``bronze.quarantine``: raw text, source, file and reason of every other line."""
    return parsed.where(F.col("_reason").isNotNull()).select(
        F.lit(source).alias("source"),
        F.col("value").alias("raw"),
        F.col("_reason").alias("reason"),
        F.col("_detail").alias("detail"),
        "_source_file",
        "_ingested_at",
    )


def _flow(source: str) -> Flow:
    return Flow(
        name=f"bronze.{source}",
        description=f"landing/{source} JSON lines to bronze.{source}, bad lines to quarantine",
        inputs=(LandingInput(source),),
        transform=partial(parse_lines, source=source),
        params=lambda settings: {"max_bytes": settings.bronze.max_record_bytes},
        outputs=(
            Output(
                f"bronze.{source}",
                partial(bronze_rows, source=source),
                table_schema(source),
                event_time=EVENT_TIME[source],
            ),
            Output(
                QUARANTINE_TABLE,
                partial(quarantine_rows, source=source),
                QUARANTINE_SCHEMA,
                shared_by=("source", source),
            ),
        ),
    )


# the bronze flows: one per landing source, each writing its table and the shared quarantine
FLOWS = tuple(_flow(source) for source in SOURCES)
