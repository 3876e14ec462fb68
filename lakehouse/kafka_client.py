"""A client of a Kafka broker, in librdkafka's terms (confluent-kafka): reaching it, its
topics and their offsets, creating topics. Each function takes the client options (librdkafka's
names) a secured broker needs; a refused login is one line saying so. Used by the broker's own
commands (lakehouse.tools.kafka), by ``status`` and by ``verify``."""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lakehouse.errors import LakehouseError


class KafkaError(LakehouseError, RuntimeError):
    """The broker could not be started, reached or stopped, or a topic is not as expected."""


class Client:
    """A confluent-kafka client's configuration, quiet (librdkafka's log lines would go to
    stderr), with the client ``options`` a secured broker needs (librdkafka's names), and the
    errors librdkafka reports apart from the calls (a refused login among them)."""

    def __init__(self, bootstrap: str, options: Mapping[str, str] | None = None, **own: Any):
        self.bootstrap = bootstrap
        self.errors: list = []
        self.config = {
            "bootstrap.servers": bootstrap,
            "log_level": 0,
            "error_cb": self.errors.append,
            **(options or {}),
            **own,
        }

    def metadata(self, client, timeout_s: float, topic: str | None = None):
        """``client.list_topics``, in tries of a second: a login the broker refused ends it
        at once (librdkafka says so only to the error callback), with a line saying so."""
        from confluent_kafka import KafkaException

        deadline = time.monotonic() + timeout_s
        while True:
            left = max(0.1, min(1.0, deadline - time.monotonic()))
            try:
                return client.list_topics(topic, timeout=left)
            except KafkaException as exc:
                client.poll(0)  # (serves the error callback)
                refused = next((e for e in self.errors if e.code() in _refused_codes()), None)
                if refused is not None:
                    raise unreachable(self.bootstrap, refused) from None
                if time.monotonic() >= deadline:
                    raise unreachable(self.bootstrap, exc.args[0]) from None


def admin(bootstrap: str, options: Mapping[str, str] | None = None):
    """confluent-kafka's admin client, quiet (its own log lines would go to stderr), with the
    client ``options`` a secured broker needs (librdkafka's names)."""
    from confluent_kafka.admin import AdminClient

    return AdminClient(Client(bootstrap, options).config)


def answers(bootstrap: str, timeout_s: float = 5, options: Mapping[str, str] | None = None) -> bool:
    """The broker at ``bootstrap`` returns its metadata."""
    from confluent_kafka.admin import AdminClient

    client = Client(bootstrap, options)
    try:
        client.metadata(AdminClient(client.config), timeout_s)
    except KafkaError:
        return False
    return True


def _refused_codes() -> tuple[int, ...]:
    """librdkafka's codes of a login or TLS handshake the broker refused."""
    from confluent_kafka import KafkaError as Code

    return (Code._AUTHENTICATION, Code.SASL_AUTHENTICATION_FAILED, Code._SSL)


# "sasl_plaintext://127.0.0.1:9092/bootstrap: ": where librdkafka's error happened
_PLACE = re.compile(r"^\w+://\S+?: ")


def unreachable(bootstrap: str, error) -> KafkaError:
    """The error for a call to the broker that failed with librdkafka's ``error``: refused
    credentials (or TLS) say so, anything else is a broker that does not answer."""
    if error.code() in _refused_codes():
        return KafkaError(
            f"the Kafka broker at {bootstrap} refused the connection: "
            f"{_PLACE.sub('', error.str())}; check the credentials and TLS settings in "
            "kafka.options"
        )
    return KafkaError(f"no Kafka broker answers at {bootstrap}: {error.str()}")


@dataclass(frozen=True)
class TopicOffsets:
    topic: str
    # per partition: its first offset still kept, and its end (the next record's offset)
    offsets: tuple[tuple[int, int], ...]

    @property
    def ends(self) -> tuple[int, ...]:
        return tuple(end for _first, end in self.offsets)

    @property
    def records(self) -> int:
        return sum(end - first for first, end in self.offsets)


def topics(
    bootstrap: str, timeout_s: float = 10, options: Mapping[str, str] | None = None
) -> list[TopicOffsets]:
    """Every topic but Kafka's internal ones, by name, with its partitions' end offsets."""
    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka.admin import AdminClient

    client = Client(bootstrap, options)
    metadata = client.metadata(AdminClient(client.config), timeout_s)
    consumer = Consumer(
        Client(bootstrap, {"group.id": "lakehouse-status", **(options or {})}).config
    )
    try:
        found = []
        for name in sorted(t for t in metadata.topics if not t.startswith("__")):
            partitions = sorted(metadata.topics[name].partitions)
            offsets = tuple(
                _watermarks(consumer, TopicPartition(name, p), timeout_s) for p in partitions
            )
            found.append(TopicOffsets(name, offsets))
        return found
    finally:
        consumer.close()


def _watermarks(consumer, partition, timeout_s: float) -> tuple[int, int]:
    """A partition's first and end offsets; a retriable error (a topic created a moment ago
    whose leader is not serving yet: NOT_LEADER_FOR_PARTITION) is tried again for a while."""
    from confluent_kafka import KafkaError as Code
    from confluent_kafka import KafkaException

    not_yet = (Code.NOT_LEADER_FOR_PARTITION, Code.LEADER_NOT_AVAILABLE)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return consumer.get_watermark_offsets(partition, timeout=timeout_s)
        except KafkaException as exc:
            error = exc.args[0]
            if not (error.retriable() or error.code() in not_yet) or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def create_topics(
    bootstrap: str,
    names: tuple[str, ...] | list[str],
    partitions: int,
    options: Mapping[str, str] | None = None,
) -> None:
    """Create the topics that do not exist yet, with ``partitions`` partitions each; a topic
    that exists with another number of partitions is an error (its records' keys would map
    to other partitions than the settings say)."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    config = Client(bootstrap, options)
    client = AdminClient(config.config)
    existing = config.metadata(client, 10).topics
    for name in names:
        if name in existing and len(existing[name].partitions) != partitions:
            raise KafkaError(
                f"topic {name} at {bootstrap} has {len(existing[name].partitions)} partitions, "
                f"not the {partitions} of kafka.partitions; set it to match, or use new topics"
            )
    new = [NewTopic(n, partitions, 1) for n in names if n not in existing]
    for name, future in client.create_topics(new).items() if new else []:
        try:
            future.result(timeout=30)
        except KafkaException as exc:
            raise KafkaError(f"could not create topic {name}: {exc.args[0].str()}") from None
