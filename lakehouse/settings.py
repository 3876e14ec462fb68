"""Typed settings: built-in defaults, a TOML profile, environment variables, command-line flags.

Precedence, lowest first: the defaults below, ``[defaults]`` of the TOML file, ``[profiles.<name>]``
of the TOML file, ``LAKEHOUSE_*`` environment variables, then explicit overrides (command line).
Every value is validated when the settings are loaded, so a typo fails at start-up with the key and
the allowed values, not an hour later inside a streaming query. A ``LAKEHOUSE_*`` variable whose
first part names no setting at all may belong to something else: it is ignored with a warning.

The lake layout under ``root`` is fixed (docs/architecture.md 4): ``landing/<source>/``,
``tables/<layer>/<table>/`` and ``checkpoints/<layer>/<flow>/``. Layer code asks this module for
paths; it never spells one.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import logging
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints

from lakehouse import kafka_options
from lakehouse.errors import LakehouseError
from lakehouse.redaction import masked, remember

LAYERS = ("bronze", "silver", "gold", "ops")
# Settings that existed once and are gone: a value that asks for what they did fails in one
# line saying so; the harmless value (what the project does now anyway) is ignored
RETIRED = {
    "backend": (
        "native",
        "the embedded Delta backend (delta-rs) is gone: every table is read and written with "
        "delta-spark; remove the setting 'backend'",
    ),
}
TRIGGERS = ("available-now", "continuous")
STATE_STORES = ("rocksdb", "hdfs")
ENV_PREFIX = "LAKEHOUSE_"
# LAKEHOUSE_* variables of the project that are not settings: PROFILE and CONFIG choose the
# settings; HOME is the checkout the Airflow DAG file runs the tasks in, FAILPOINT a crash a test
# injects, AIRFLOW_BIN the tests' Airflow. Any other variable whose first part names no setting
# (a variable of another tool, a section misspelt) is ignored with one warning.
PROJECT_VARIABLES = ("PROFILE", "CONFIG", "HOME", "FAILPOINT", "AIRFLOW_BIN")
_DURATION = re.compile(r"^\s*(\d+)\s*(second|minute|hour|day)s?\s*$")
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_TOPIC_PREFIX = re.compile(r"^[A-Za-z0-9._-]{0,200}$")
_CONN_ID = re.compile(r"^[A-Za-z0-9_.-]{1,250}$")  # what Airflow accepts as a connection id
_BOOTSTRAP = re.compile(r"^[^\s,:]+:\d{1,5}(,[^\s,:]+:\d{1,5})*$")
_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
# tables of free-form keys: Spark's configuration, Kafka's client options (by dotted key)
FREE_FORM = ("spark_conf", "kafka.options", "kafka.librdkafka_options")


log = logging.getLogger(__name__)
# the variables already warned about: one warning per variable and process, however often the
# settings are loaded
_WARNED: set[str] = set()


class SettingsError(LakehouseError, ValueError):
    """A setting is unknown, missing or has a value outside what is allowed."""


def _masked_repr(self) -> str:
    """The dataclass's repr with the secret values of its tables masked
    (:mod:`lakehouse.redaction`)."""
    parts = []
    for f in dataclasses.fields(self):
        value = getattr(self, f.name)
        parts.append(f"{f.name}={masked(value) if isinstance(value, dict) else value!r}")
    return f"{type(self).__name__}({', '.join(parts)})"


def duration_seconds(text: str) -> int:
    """Parse a Spark-style duration such as ``"10 minutes"`` into seconds."""
    match = _DURATION.match(text)
    if not match:
        raise SettingsError(
            f"invalid duration {text!r}: use '<n> seconds|minutes|hours|days', e.g. '10 minutes'"
        )
    unit = {"second": 1, "minute": 60, "hour": 3600, "day": 86400}[match.group(2)]
    return int(match.group(1)) * unit


@dataclass(frozen=True)
class TriggerSettings:
    mode: str = "available-now"
    interval: str = "5 seconds"  # processing-time interval of the continuous mode
    max_files_per_trigger: int = 0  # 0: no limit
    # a layer's own interval in continuous mode; "" = interval
    bronze_interval: str = ""
    silver_interval: str = ""
    gold_interval: str = ""
    # continuous mode: a flow that fails is started again alone after restart_delay, doubled
    # at each of its restarts (at most 10 minutes), at most `restarts` times in a run
    restarts: int = 5
    restart_delay: str = "10 seconds"

    def interval_of(self, layer: str) -> str:
        """The processing-time interval of ``layer``'s flows in continuous mode."""
        return getattr(self, f"{layer}_interval", "") or self.interval


@dataclass(frozen=True)
class StateStoreSettings:
    provider: str = "rocksdb"
    changelog_checkpointing: bool = True
    min_batches_to_retain: int = 20


@dataclass(frozen=True)
class WatermarkSettings:
    events: str = "10 minutes"
    impressions: str = "2 hours"
    clicks: str = "3 hours"
    # gold over silver.ad_attribution, on impression_time: an unmatched impression reaches
    # silver once the join's watermark passes it plus the 1-hour click window, so this must
    # exceed 1 hour + the larger of the two above
    attribution: str = "5 hours"


@dataclass(frozen=True)
class MaintenanceSettings:
    vacuum_retention_hours: int = 168
    target_file_size_mb: int = 128
    # tables maintained at once (those whose writers' locks overlap take turns)
    parallel_tables: int = 4


@dataclass(frozen=True)
class WriteSettings:
    # A micro-batch's rows for a table that streams read (bronze and silver) written by
    # delta-spark go in files of about this many rows at most, one range of event times each
    # (one file for a smaller micro-batch), so a reader admitting a few files at a time sees
    # them in time order; delta-rs writes such a micro-batch in one file
    rows_per_file: int = 500_000


@dataclass(frozen=True)
class NativeSettings:
    # The folder of delta-spark's jars (and the Kafka connector's) put on the classpath;
    # "" = the project's jars/lib, which `make setup` fills from jars/pom.xml with Maven.
    jars_dir: str = ""
    # Or Maven coordinates Spark resolves itself at start-up (spark.jars.packages, Ivy):
    # used only when set and jars_dir is not.
    jars_packages: str = ""


@dataclass(frozen=True)
class BronzeSettings:
    # where bronze reads raw events: "files" (landing/<source>/) or "kafka" (topic <source>)
    source: str = "files"
    # a landing line or Kafka record larger than this goes to quarantine whole (too_large)
    max_record_bytes: int = 1_000_000
    # a landing line this long (with its line end) is not read at all: Spark skips it in
    # constant memory and bronze quarantines it (too_large) without its text, which stays in
    # the landing file
    max_line_bytes: int = 64 * 1024 * 1024

    def __post_init__(self) -> None:
        if self.max_line_bytes <= self.max_record_bytes:
            raise SettingsError(
                f"setting 'bronze.max_line_bytes' ({self.max_line_bytes:,}) must be larger "
                f"than bronze.max_record_bytes ({self.max_record_bytes:,})"
            )


@dataclass(frozen=True)
class TopicSettings:
    """What one bronze flow reading Kafka may set apart from the others (``kafka.<source>``)."""

    # the flow's topic; "" = <kafka.topic_prefix><source>
    topic: str = ""
    # where the flow's first run starts: "" = kafka.starting_offsets; earliest, latest, or
    # per partition a JSON object of offsets ({"0": 1200, "1": -2}; -2 earliest, -1 latest)
    starting_offsets: str = ""
    # records a micro-batch reads at most; -1 = kafka.max_offsets_per_trigger, 0 = no limit
    max_offsets_per_trigger: int = -1


@dataclass(frozen=True)
class KafkaSettings:
    bootstrap_servers: str = "127.0.0.1:9092"
    # the topics are <prefix><source>: events, impressions and clicks by default; a prefix
    # ("shop1.") keeps several lakes, or tests, apart on one broker
    topic_prefix: str = ""
    # partitions of each topic `lakehouse generate --sink kafka` creates
    partitions: int = 3
    # where a bronze flow's first run starts reading its topic; later runs go on from their
    # checkpoint's offsets
    starting_offsets: str = "earliest"
    # records a bronze micro-batch reads at most, over its topic's partitions; 0: no limit
    max_offsets_per_trigger: int = 0
    # a bronze flow fails when records it has not read are gone from the broker (retention, a
    # deleted topic); false accepts the loss for a run and goes on from what is left
    fail_on_data_loss: bool = True
    # how long a call to the broker may take; Spark's Kafka source tries 3 times, so a flow
    # fails after about 3 x this without a broker
    api_timeout_s: int = 60
    # per topic (by source): its name, and what differs from the two settings above
    events: TopicSettings = field(default_factory=TopicSettings)
    impressions: TopicSettings = field(default_factory=TopicSettings)
    clicks: TopicSettings = field(default_factory=TopicSettings)
    # Kafka client options in Apache Kafka's names (security.protocol, sasl.mechanism,
    # sasl.jaas.config, ssl.truststore.location, ...): to Spark's Kafka source as
    # kafka.<key>, to the project's own clients in librdkafka's names (lakehouse.kafka_options)
    options: dict[str, str] = field(default_factory=dict)
    # a Java properties file of such options (a client.properties), read when the settings
    # load; kafka.options set elsewhere win over it
    options_file: str = ""
    # librdkafka's options for the project's own clients (generate, status, verify), over
    # those translated from kafka.options: e.g. ssl.ca.location where Spark has a JKS truststore
    librdkafka_options: dict[str, str] = field(default_factory=dict)

    __repr__ = _masked_repr

    def __post_init__(self):
        remember(self.options)
        remember(self.librdkafka_options)

    def topic_of(self, source: str) -> str:
        """The topic of landing source ``source``."""
        own = getattr(self, source, None)
        return (own.topic if isinstance(own, TopicSettings) else "") or self.topic_prefix + source

    def spark_options(self) -> dict[str, str]:
        """The client options as options of Spark's Kafka source (``kafka.<key>``)."""
        return kafka_options.spark_options(self.options)

    def client_options(self) -> dict[str, str]:
        """The client options of the project's confluent-kafka clients (librdkafka's names),
        without bootstrap.servers."""
        return kafka_options.librdkafka(self.options, self.librdkafka_options)

    def starting_offsets_of(self, source: str, topic: str) -> str:
        """Spark's ``startingOffsets`` for the topic of ``source``."""
        own = getattr(self, source).starting_offsets
        if not own.startswith("{"):
            return own or self.starting_offsets
        return json.dumps({topic: json.loads(own)})

    def max_offsets_of(self, source: str) -> int:
        """Records per micro-batch at most for the topic of ``source`` (0: no limit)."""
        own = getattr(self, source).max_offsets_per_trigger
        return self.max_offsets_per_trigger if own < 0 else own


@dataclass(frozen=True)
class S3Settings:
    """How Spark (Hadoop's S3A), delta-rs and pyarrow reach an S3 store. The keys are never
    settings: they come from the usual AWS variables (``AWS_ACCESS_KEY_ID``,
    ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``) or, on AWS, the machine's role."""

    # the store's URL ("http://127.0.0.1:8333"); "" = AWS_ENDPOINT_URL, else AWS S3 itself
    endpoint: str = ""
    # its region; "" = AWS_REGION (or AWS_DEFAULT_REGION), else us-east-1
    region: str = ""
    # buckets addressed as http://endpoint/bucket (most S3-compatible stores) rather than
    # http://bucket.endpoint (AWS)
    path_style: bool = False

    def resolved_endpoint(self, env: Mapping[str, str] | None = None) -> str:
        env = os.environ if env is None else env
        return self.endpoint or env.get("AWS_ENDPOINT_URL", "")

    def resolved_region(self, env: Mapping[str, str] | None = None) -> str:
        env = os.environ if env is None else env
        return self.region or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1"


@dataclass(frozen=True)
class SqlSettings:
    """``lakehouse serve-sql`` (the JDBC server) and ``lakehouse sql``."""

    host: str = "127.0.0.1"
    port: int = 10000
    # the server's users and their password hashes (lakehouse sql-passwd writes it; a mounted
    # secret in a container): required when host is not a loopback address; "" = no login
    auth_file: str = ""
    # where the catalog of tables and views lives: "embedded", a Derby database under
    # catalog_dir, held by one process at a time; "external", the metastore spark_conf or a
    # hive-site.xml name (a metastore database or service a cluster shares)
    metastore: str = "embedded"
    # the embedded catalog's folder (metastore_db/, warehouse/, derby.log); "" = <root>/catalog
    catalog_dir: str = ""
    # how often the server looks for tables written since it started
    refresh_interval: str = "5 seconds"


@dataclass(frozen=True)
class GoldSettings:
    # processing-time TTL of the state of processors in the ProcessingTime mode
    # (gold.purchase_alerts): a key not seen for this long is forgotten
    state_ttl: str = "6 hours"
    session_max_pages: int = 50  # pages listed per gold.sessions_custom row, in order
    # gold.sessions_custom keys its state by bucket of users: fewer, larger state calls.
    # About users / 150 is a good size (64 for 1,000,000 events); more buckets mean smaller state rewritten per batch
    session_buckets: int = 64
    # gold.user_activity_spans keys its state by bucket of users too: one call per bucket
    span_buckets: int = 64
    # a table of open sessions (gold.sessions_custom.SEED_SCHEMA) the first run of
    # gold.sessions_custom starts from, e.g. when migrating from another job; "" = none
    sessions_seed_table: str = ""


@dataclass(frozen=True)
class SchedulerSettings:
    """The Airflow DAGs of ``orchestration/dags/lakehouse_dags.py``."""

    schedule: str = "@hourly"  # cron expression or preset of the pipeline DAG
    maintenance_schedule: str = "@daily"  # of the maintenance DAG (``lakehouse maintain``)
    retries: int = 2  # per task
    retry_delay: str = "5 minutes"
    # events generated per pipeline run before bronze (synthetic data for demos); 0 = no task
    generate_events: int = 0
    # folder holding ``spark-submit`` and ``lakehouse``; "" = found on the PATH
    bin_dir: str = ""
    # the Airflow connection of the layers' spark-submit tasks: it holds the master (and
    # deploy mode); spark-submit's master is the job's (lakehouse.session.submitted_settings)
    spark_conn_id: str = "spark_default"
    # where each pipeline run packs the installed project for spark-submit first (code zip, the
    # layers' entry points, log4j2 file, jars: lakehouse.tools.dist); "" = <root>/dist
    dist_dir: str = ""


def local_cores(master: str) -> int | None:
    """The cores a local master runs on (``local``: 1; ``local[N]`` and ``local[N,F]``: N;
    ``local[*]``: the cores this process may run on); None for any other master."""
    match = re.fullmatch(r"local(?:\[\s*(\*|\d+)\s*(?:,\s*\d+\s*)?\])?", master.strip())
    if match is None:
        return None
    cores = match.group(1)
    if cores is None:
        return 1
    if cores != "*":
        return max(1, int(cores))
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


@dataclass(frozen=True)
class Settings:
    profile: str = "local"
    root: Path = Path("./lakehouse-data")
    master: str = "local[*]"
    app_name: str = "lakehouse"
    shuffle_partitions: int = 0  # 0: one per core of a local master (see ``partitions``)
    log_level: str = "WARN"
    ui_enabled: bool = False
    # Options of the Spark driver's JVM, after the project's own (a local master runs all of
    # Spark in it), e.g. "-XX:TieredStopAtLevel=1" (conf/lakehouse.toml says when it pays).
    driver_java_options: str = ""
    trigger: TriggerSettings = field(default_factory=TriggerSettings)
    state_store: StateStoreSettings = field(default_factory=StateStoreSettings)
    watermarks: WatermarkSettings = field(default_factory=WatermarkSettings)
    maintenance: MaintenanceSettings = field(default_factory=MaintenanceSettings)
    write: WriteSettings = field(default_factory=WriteSettings)
    native: NativeSettings = field(default_factory=NativeSettings)
    bronze: BronzeSettings = field(default_factory=BronzeSettings)
    kafka: KafkaSettings = field(default_factory=KafkaSettings)
    sql: SqlSettings = field(default_factory=SqlSettings)
    s3: S3Settings = field(default_factory=S3Settings)
    gold: GoldSettings = field(default_factory=GoldSettings)
    scheduler: SchedulerSettings = field(default_factory=SchedulerSettings)
    # Free-form Spark configuration passed through unchanged (key -> value).
    spark_conf: dict[str, str] = field(default_factory=dict)
    # Tables ("layer.table") and checkpoints (checkpoint_key("layer.flow"): a flow and its
    # table often share a name) somewhere else than their place under root: the staging run
    # of `lakehouse run --full-refresh` (lakehouse.runner.refresh) sets them.
    relocated: dict[str, str] = field(default_factory=dict)

    __repr__ = _masked_repr

    def __post_init__(self):
        remember(self.spark_conf)

    # ---- lake layout -------------------------------------------------------------------
    @property
    def partitions(self) -> int:
        """The shuffle partitions the session uses: ``shuffle_partitions``, or when it is 0,
        one per core of a local master (``local[N]``: N; ``local[*]``: this machine's
        cores), else 8. One per core is what a small machine runs fastest: on 2 cores, 2
        partitions against 4 took the demo's three layers from 65 to 59 s and the whole
        pipeline on 1,000,000 events from 161 to 152 s (bench/RESULTS.md). A checkpoint keeps
        the number it started with."""
        return self.shuffle_partitions or local_cores(self.master) or 8

    def landing_path(self, source: str | None = None) -> Path:
        base = self.root / "landing"
        return base / _checked_name("source", source) if source else base

    def table_path(self, name: str) -> Path:
        """Location of table ``layer.table``, e.g. ``gold.sessions`` -> ``tables/gold/sessions``."""
        layer, table = split_table_name(name)
        if name in self.relocated:
            return Path(self.relocated[name])
        return self.root / "tables" / layer / table

    def topic(self, source: str) -> str:
        """The Kafka topic of landing source ``source``: ``kafka.<source>.topic``, or else
        ``<kafka.topic_prefix><source>``."""
        return self.kafka.topic_of(_checked_name("source", source))

    def checkpoint_path(self, layer: str, flow: str) -> Path:
        if layer not in LAYERS:
            raise SettingsError(f"unknown layer {layer!r}; allowed: {', '.join(LAYERS)}")
        if checkpoint_key(f"{layer}.{flow}") in self.relocated:
            return Path(self.relocated[checkpoint_key(f"{layer}.{flow}")])
        return self.root / "checkpoints" / layer / _checked_name("flow", flow)

    def with_overrides(self, overrides: Mapping[str, Any]) -> Settings:
        """A copy with dotted-key overrides applied (``{"trigger.mode": "continuous"}``)."""
        data = _as_dict(self)
        for key, value in overrides.items():
            if value is not None:
                _set_dotted(data, key, value)
        return _build(Settings, data, "")


def checkpoint_key(flow: str) -> str:
    """The key of flow ``layer.flow``'s checkpoint in :attr:`Settings.relocated` (its tables
    are keyed by their names, which a flow's name often equals)."""
    return f"checkpoint:{flow}"


def split_table_name(name: str) -> tuple[str, str]:
    parts = name.split(".")
    if len(parts) != 2 or parts[0] not in LAYERS or not _NAME.match(parts[1]):
        raise SettingsError(
            f"invalid table name {name!r}: expected '<layer>.<table>' with layer one of "
            f"{', '.join(LAYERS)} and a lower-case table name"
        )
    return parts[0], parts[1]


def _checked_name(kind: str, name: str) -> str:
    if not _NAME.match(name):
        raise SettingsError(f"invalid {kind} name {name!r}: use lower-case letters, digits and _")
    return name


# ---- loading ---------------------------------------------------------------------------


def default_config_path() -> Path | None:
    """``$LAKEHOUSE_CONFIG``, else ``./conf/lakehouse.toml``, else the checkout's own copy.

    None (an installed package run outside a checkout): the built-in defaults apply, which are
    the checkout file's ``[defaults]`` and ``[profiles.local]`` (tests/test_settings.py checks),
    so the ``local`` profile works without a file; the others need one."""
    explicit = os.environ.get(ENV_PREFIX + "CONFIG")
    if explicit:
        return Path(explicit)
    for candidate in (
        Path.cwd() / "conf" / "lakehouse.toml",
        Path(__file__).resolve().parent.parent / "conf" / "lakehouse.toml",
    ):
        if candidate.is_file():
            return candidate
    return None


def load_settings(
    profile: str | None = None,
    config_path: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
) -> Settings:
    """Load and validate settings; raise :class:`SettingsError` naming the offending key."""
    env = os.environ if env is None else env
    path = Path(config_path) if config_path else default_config_path()
    document: dict[str, Any] = {}
    if path is not None:
        if not path.is_file():
            raise SettingsError(f"settings file {path} does not exist")
        try:
            document = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise SettingsError(f"settings file {path} is not valid TOML: {exc}") from None
        unknown = set(document) - {"defaults", "profiles"}
        if unknown:
            raise SettingsError(
                f"unknown section(s) {sorted(unknown)} in {path}; allowed: defaults, profiles"
            )
    profiles = document.get("profiles", {})
    profile = profile or env.get(ENV_PREFIX + "PROFILE") or "local"
    if profiles and profile not in profiles:
        raise SettingsError(
            f"unknown profile {profile!r}; allowed: {', '.join(sorted(profiles))}"
            + (f" (from {path})" if path else "")
        )
    if not profiles and profile != "local":
        if path is None:
            raise SettingsError(
                f"unknown profile {profile!r}: without a settings file (there is none at "
                "./conf/lakehouse.toml; give one with --config or LAKEHOUSE_CONFIG) the only "
                "profile is 'local'"
            )
        raise SettingsError(f"unknown profile {profile!r}: {path} defines no profiles")

    data = _as_dict(Settings())
    _deep_merge(data, document.get("defaults", {}), "")
    _deep_merge(data, profiles.get(profile, {}), "")
    data["profile"] = profile
    for key, value in env.items():
        if not key.startswith(ENV_PREFIX) or key[len(ENV_PREFIX) :] in PROJECT_VARIABLES:
            continue
        dotted = key[len(ENV_PREFIX) :].lower().replace("__", ".")
        if dotted.split(".")[0] not in data and dotted not in RETIRED:
            _warn_ignored(key, dotted, data)
        else:  # a key misspelt inside a known section still fails
            _set_dotted(data, dotted, value, source=f"environment variable {key}")
    for key, value in (overrides or {}).items():
        if value is not None:
            _set_dotted(data, key, value)
    return _build(Settings, data, "")


def _warn_ignored(key: str, dotted: str, data: Mapping[str, Any]) -> None:
    """One line, once per process, for a ``LAKEHOUSE_*`` variable that names no setting."""
    if key in _WARNED:
        return
    _WARNED.add(key)
    first = dotted.split(".")[0]
    hint = ""
    close = difflib.get_close_matches(first, list(data), n=1)
    if close:
        rest = key[len(ENV_PREFIX) + len(first) :]
        hint = f" (did you mean {ENV_PREFIX}{close[0].upper()}{rest}?)"
    log.warning(
        "lakehouse: warning: ignoring environment variable %s: no setting is named %r%s",
        key,
        first,
        hint,
    )


def _as_dict(obj: Any) -> dict[str, Any]:
    out = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        out[f.name] = _as_dict(value) if dataclasses.is_dataclass(value) else value
    return out


def _deep_merge(target: dict[str, Any], source: Mapping[str, Any], prefix: str) -> None:
    for key, value in source.items():
        dotted = prefix + key
        if _retired(dotted, value):
            continue
        if key not in target:
            raise SettingsError(_unknown_key(dotted, target))
        if dotted in FREE_FORM:
            target[key] = {**target[key], **_flat(dotted, value)}
        elif isinstance(target[key], dict):
            if not isinstance(value, Mapping):
                raise SettingsError(f"setting {dotted!r} must be a table of settings")
            _deep_merge(target[key], value, dotted + ".")
        else:
            target[key] = value


def _flat(dotted: str, table: Any) -> dict[str, str]:
    """A free-form table as key: text; a TOML table under it (security.protocol written
    without quotes) joined into dotted keys, true and false in lower case."""
    if not isinstance(table, Mapping):
        raise SettingsError(f"setting {dotted!r} must be a table of key = value")
    out: dict[str, str] = {}
    for key, value in table.items():
        if isinstance(value, Mapping):
            out.update({f"{key}.{k}": v for k, v in _flat(dotted, value).items()})
        else:
            out[str(key)] = str(value).lower() if isinstance(value, bool) else str(value)
    return out


def _set_dotted(data: dict[str, Any], dotted: str, value: Any, source: str | None = None) -> None:
    if _retired(dotted, value, source):
        return
    parts = dotted.split(".")
    node = data
    for i, part in enumerate(parts):
        here = ".".join(parts[: i + 1])
        table = ".".join(parts[:i])
        if table in FREE_FORM:
            key = ".".join(parts[i:])
            if table.startswith("kafka."):  # (no Kafka option has "_": an environment
                key = key.replace("_", ".")  # variable's name can only spell its dots so)
            node[key] = str(value)
            return
        if part not in node:
            msg = _unknown_key(here, node)
            raise SettingsError(f"{msg} (from {source})" if source else msg)
        if i == len(parts) - 1:
            node[part] = value
        else:
            if not isinstance(node[part], dict):
                raise SettingsError(f"setting {here!r} has no sub-settings")
            node = node[part]


def _retired(dotted: str, value: Any, source: str | None = None) -> bool:
    """Whether ``dotted`` is a retired setting (:data:`RETIRED`): True to ignore it, an error
    when its value asks for what is gone."""
    if dotted not in RETIRED:
        return False
    harmless, message = RETIRED[dotted]
    if str(value).strip().lower() != harmless:
        raise SettingsError(f"{message} (from {source})" if source else message)
    return True


def _unknown_key(dotted: str, siblings: Mapping[str, Any]) -> str:
    if dotted in _REMOVED:
        return f"setting {dotted!r} was removed: {_REMOVED[dotted]}; remove it"
    return f"unknown setting {dotted!r}; allowed here: {', '.join(sorted(siblings))}"


# settings of an earlier release, and why they went
_REMOVED = {
    key: "every table is written by the one engine its declaration names (delta-rs by default), "
    "whatever the size of a micro-batch"
    for key in ("write.arrow_upsert_rows", "write.arrow_append_rows")
}


_CHOICES = {
    "trigger.mode": TRIGGERS,
    "state_store.provider": STATE_STORES,
    "log_level": ("ERROR", "WARN", "INFO", "DEBUG"),
    "bronze.source": ("files", "kafka"),
    "kafka.starting_offsets": ("earliest", "latest"),
    "sql.metastore": ("embedded", "external"),
}
_DURATIONS = {
    "trigger.interval",
    "trigger.bronze_interval",
    "trigger.silver_interval",
    "trigger.gold_interval",
    "trigger.restart_delay",
    "watermarks.events",
    "watermarks.impressions",
    "watermarks.clicks",
    "watermarks.attribution",
    "gold.state_ttl",
    "scheduler.retry_delay",
    "sql.refresh_interval",
}
_MAY_BE_EMPTY = {"trigger.bronze_interval", "trigger.silver_interval", "trigger.gold_interval"}
_POSITIVE = {
    "state_store.min_batches_to_retain",
    "maintenance.parallel_tables",
    "sql.port",
    "gold.session_max_pages",
    "gold.session_buckets",
    "gold.span_buckets",
    "write.rows_per_file",
    "kafka.partitions",
    "kafka.api_timeout_s",
    "bronze.max_record_bytes",
    "bronze.max_line_bytes",
}
_NON_NEGATIVE = {
    "shuffle_partitions",
    "trigger.max_files_per_trigger",
    "trigger.restarts",
    "maintenance.vacuum_retention_hours",
    "maintenance.target_file_size_mb",
    "scheduler.retries",
    "scheduler.generate_events",
    "kafka.max_offsets_per_trigger",
}


_TOPIC_START = ".starting_offsets"  # kafka.<source>.starting_offsets (kafka.starting_offsets
_TOPIC_MAX = ".max_offsets_per_trigger"  # is checked by _CHOICES before this suffix is)


def _check_partition_offsets(dotted: str, text: str) -> None:
    """A topic's starting offsets: "", earliest, latest, or {"<partition>": offset, ...}."""
    if dotted == "kafka" + _TOPIC_START or text in ("", "earliest", "latest"):
        return
    try:
        offsets = json.loads(text)
    except ValueError:
        offsets = None
    good = (
        isinstance(offsets, dict)
        and offsets
        and all(
            k.isdigit() and isinstance(v, int) and not isinstance(v, bool) and v >= -2
            for k, v in offsets.items()
        )
    )
    if not good:
        raise SettingsError(
            f"setting {dotted!r} must be earliest, latest, or a JSON object of offsets per "
            f'partition such as {{"0": 1200, "1": -2}} (-2 earliest, -1 latest); got {text!r}'
        )


def _build(cls: type, data: Mapping[str, Any], prefix: str) -> Any:
    hints = get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        dotted = prefix + f.name
        kwargs[f.name] = _coerce(dotted, hints[f.name], data[f.name])
    if cls is KafkaSettings:
        _check_kafka(kwargs)
    return cls(**kwargs)


def _check_kafka(kwargs: dict[str, Any]) -> None:
    """The client options with those of kafka.options_file under them, checked; one topic per
    source."""
    if kwargs["options_file"]:
        path = Path(os.path.expanduser(kwargs["options_file"]))
        try:
            from_file = kafka_options.read_properties(path)
        except (OSError, UnicodeDecodeError) as exc:
            why = getattr(exc, "strerror", None) or "not a text file"
            raise SettingsError(
                f"setting 'kafka.options_file': cannot read {path}: {why}"
            ) from None
        kwargs["options"] = {**from_file, **kwargs["options"]}
    try:
        kwargs["options"] = kafka_options.check(kwargs["options"])
    except kafka_options.OptionError as exc:
        raise SettingsError(str(exc)) from None
    for key in kwargs["librdkafka_options"]:
        if key == "bootstrap.servers":
            raise SettingsError(
                "setting 'kafka.librdkafka_options.bootstrap.servers' cannot be set: the brokers "
                "are setting kafka.bootstrap_servers"
            )
    topics: dict[str, str] = {}
    for source in ("events", "impressions", "clicks"):
        topic = kwargs[source].topic or kwargs["topic_prefix"] + source
        if topic in topics:
            raise SettingsError(
                f"sources {topics[topic]} and {source} both read topic {topic}: set "
                f"kafka.{source}.topic (or kafka.{topics[topic]}.topic) to a topic of its own"
            )
        topics[topic] = source


# a URI's scheme: "s3a://bucket/lake" (a Windows drive, "C:\\lake", has no "//")
_URI = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def _local_path(dotted: str, text: str) -> Path:
    """A folder setting's path. A ``file://`` URI is its local path; any other URI is refused
    in one line: the lake lives on a local disk, and a URI taken as a path would become a
    folder named after its scheme (``./s3a:/bucket/lake``). Only the scheme is said: a URI may
    carry credentials (``s3a://KEY:SECRET@bucket``)."""
    if not text.strip():
        raise SettingsError(f"setting {dotted!r} must not be empty")
    uri = _URI.match(text.strip())
    if uri and uri.group(1).lower() == "file":
        local = text.strip()[len(uri.group(0)) :]
        if not local.startswith("/"):
            raise SettingsError(
                f"setting {dotted!r}: a file:// URI names an absolute path (file:///srv/lake)"
            )
        return Path(local)
    if uri:
        raise SettingsError(
            f"setting {dotted!r} is a {uri.group(1)}:// URI: this version keeps the lake on a "
            "local disk only (object storage is not supported yet); give a local folder"
        )
    return Path(os.path.expanduser(text))


def _coerce(dotted: str, hint: Any, value: Any) -> Any:
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, dotted + ".")
    if get_origin(hint) is dict:
        return _flat(dotted, value)
    if hint is Path:
        return _local_path(dotted, str(value))
    if hint is bool:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in ("true", "1", "yes", "on"):
            return True
        if text in ("false", "0", "no", "off"):
            return False
        raise SettingsError(f"setting {dotted!r} must be true or false; got {value!r}")
    if hint is int:
        if isinstance(value, bool):
            raise SettingsError(f"setting {dotted!r} must be an integer; got {value!r}")
        try:
            number = int(str(value).strip())
        except ValueError:
            raise SettingsError(f"setting {dotted!r} must be an integer; got {value!r}") from None
        if dotted in _POSITIVE and number <= 0:
            raise SettingsError(f"setting {dotted!r} must be > 0; got {number}")
        if dotted in _NON_NEGATIVE and number < 0:
            raise SettingsError(f"setting {dotted!r} must be >= 0; got {number}")
        if dotted.endswith(_TOPIC_MAX) and number < -1:
            raise SettingsError(
                f"setting {dotted!r} must be -1 (kafka.max_offsets_per_trigger), 0 (no limit) "
                f"or more; got {number}"
            )
        return number
    if hint is str or str in get_args(hint):
        text = str(value)
        choices = _CHOICES.get(dotted)
        if choices and text not in choices:
            raise SettingsError(
                f"setting {dotted!r} must be one of {', '.join(choices)}; got {text!r}"
            )
        topic = dotted.startswith("kafka.") and dotted.endswith(".topic")
        if topic and text and (not _TOPIC.match(text) or text in (".", "..")):
            raise SettingsError(
                f"setting {dotted!r} must be a Kafka topic name: letters, digits, '.', '_' "
                f"and '-' (at most 249); got {text!r}"
            )
        if dotted == "kafka.topic_prefix" and not _TOPIC_PREFIX.match(text):
            raise SettingsError(
                f"setting {dotted!r} may hold letters, digits, '.', '_' and '-' only; got {text!r}"
            )
        if dotted == "scheduler.spark_conn_id" and not _CONN_ID.match(text):
            raise SettingsError(
                f"setting {dotted!r} must be an Airflow connection id (letters, digits, '.', "
                f"'_', '-'); got {text!r}"
            )
        if dotted == "kafka.bootstrap_servers" and not _BOOTSTRAP.match(text):
            raise SettingsError(
                f"setting {dotted!r} must be HOST:PORT[,HOST:PORT...]; got {text!r}"
            )
        if dotted.endswith(_TOPIC_START):
            _check_partition_offsets(dotted, text)
        if dotted in _DURATIONS and (text or dotted not in _MAY_BE_EMPTY):
            try:
                duration_seconds(text)
            except SettingsError as exc:
                raise SettingsError(f"setting {dotted!r}: {exc}") from None
        return text
    raise TypeError(f"unsupported settings type {hint!r} for {dotted}")  # a bug, not user input
