"""Kafka client options (``kafka.options``): one table, in Apache Kafka's own names (what a
production cluster's ``client.properties`` holds: security.protocol, sasl.mechanism,
sasl.jaas.config, ssl.truststore.location, ...). Spark's Kafka source gets each as
``kafka.<key>``; the project's own clients (confluent-kafka, on librdkafka: the producer of
``generate --sink kafka``, the admin client and consumers of ``kafka status``, ``status`` and
``verify``) get them in librdkafka's names where those differ (:func:`librdkafka`).

Credentials may be given either way: ``sasl.jaas.config`` (Kafka's), which librdkafka gets as
``sasl.username`` and ``sasl.password`` for the PLAIN and SCRAM login modules; or
``sasl.username`` and ``sasl.password`` (librdkafka's), from which Spark's source gets the JAAS
config of ``sasl.mechanism``. No third-party import (the settings import it).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from lakehouse.errors import LakehouseError

PLAIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"
SCRAM_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"
# the login module of each mechanism whose credentials are a user name and a password
MODULES = {"PLAIN": PLAIN_MODULE, "SCRAM-SHA-256": SCRAM_MODULE, "SCRAM-SHA-512": SCRAM_MODULE}
PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
USERNAME, PASSWORD, JAAS = "sasl.username", "sasl.password", "sasl.jaas.config"
# options another setting owns, or that Spark's Kafka source refuses: why, for the error
REFUSED = {
    "bootstrap.servers": "the brokers are setting kafka.bootstrap_servers",
    "auto.offset.reset": "a bronze flow starts at kafka.starting_offsets, then goes on from "
    "its checkpoint",
    "enable.auto.commit": "Spark's Kafka source commits no offsets: they live in the checkpoint",
    "key.deserializer": "Spark's Kafka source reads keys and values as bytes",
    "value.deserializer": "Spark's Kafka source reads keys and values as bytes",
    "key.serializer": "the project's producer writes bytes",
    "value.serializer": "the project's producer writes bytes",
    "interceptor.classes": "Spark's Kafka source does not take it",
}
# options librdkafka takes by the same name, with the same meaning
SAME = frozenset(
    {
        "security.protocol",
        "sasl.mechanism",
        "sasl.kerberos.service.name",
        "ssl.key.password",
        "client.id",
        "client.rack",
        "group.id",
        "metadata.max.age.ms",
        "reconnect.backoff.ms",
        "reconnect.backoff.max.ms",
        "retry.backoff.ms",
        "socket.connection.setup.timeout.ms",
    }
)
_KEY = re.compile(r"^[a-z][a-z0-9_.-]*$")
_JAAS = re.compile(r"^\s*([\w.$]+)\s+(required|requisite|sufficient|optional)\b(.*?);?\s*$", re.S)
_JAAS_OPTION = re.compile(r'\s*(\w+)\s*=\s*("(?:\\.|[^"\\])*"|[^\s;"]+)')


class OptionError(LakehouseError, ValueError):
    """A client option that cannot be used; its message never holds the option's value (the
    settings raise it as a SettingsError)."""


def check(options: Mapping[str, str], setting: str = "kafka.options") -> dict[str, str]:
    """The options, checked (one line naming the key of the first that cannot be used, never
    its value) and with security.protocol and sasl.mechanism in upper case."""
    out = dict(options)
    for key in out:
        if not _KEY.match(key):
            raise OptionError(
                f"setting {setting!r} has key {key!r}: a Kafka client option is lower-case "
                "words with dots, such as security.protocol"
            )
        if key in REFUSED:
            raise OptionError(f"setting '{setting}.{key}' cannot be set: {REFUSED[key]}")
    for key in ("security.protocol", "sasl.mechanism"):
        if key in out:
            out[key] = out[key].strip().upper()
    protocol = out.get("security.protocol")
    if protocol is not None and protocol not in PROTOCOLS:
        raise OptionError(
            f"setting '{setting}.security.protocol' must be one of {', '.join(PROTOCOLS)}; "
            f"got {protocol!r}"
        )
    if (USERNAME in out) != (PASSWORD in out):
        raise OptionError(
            f"setting {setting!r}: {USERNAME} and {PASSWORD} go together; one is missing"
        )
    if USERNAME in out:
        if JAAS in out:
            raise OptionError(
                f"setting {setting!r}: give the credentials as {JAAS} or as {USERNAME} and "
                f"{PASSWORD}, not both"
            )
        if out.get("sasl.mechanism") not in MODULES:
            raise OptionError(
                f"setting {setting!r}: {USERNAME} and {PASSWORD} need sasl.mechanism "
                f"{', '.join(MODULES)}; got {out.get('sasl.mechanism', 'none')}"
            )
    if JAAS in out and parse_jaas(out[JAAS]) is None:
        raise OptionError(
            f"setting '{setting}.{JAAS}' is not a JAAS login module line ('<LoginModule class> "
            'required username="..." password="...";\')'
        )
    return out


def parse_jaas(text: str) -> tuple[str, dict[str, str]] | None:
    """A JAAS config line's login module and its options, None when it is not one."""
    found = _JAAS.match(text)
    if found is None:
        return None
    options, rest = {}, found[3]
    while rest.strip():
        option = _JAAS_OPTION.match(rest)
        if option is None:
            return None
        value = option[2]
        if value.startswith('"'):
            value = re.sub(r"\\(.)", r"\1", value[1:-1])
        options[option[1]] = value
        rest = rest[option.end() :]
    return found[1], options


def jaas_line(mechanism: str, username: str, password: str) -> str:
    """The JAAS config of a PLAIN or SCRAM login with these credentials."""

    def quoted(text: str) -> str:
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'

    return f"{MODULES[mechanism]} required username={quoted(username)} password={quoted(password)};"


def spark_options(options: Mapping[str, str]) -> dict[str, str]:
    """The options of Spark's Kafka source: ``kafka.<key>``, credentials given as
    sasl.username and sasl.password turned into the JAAS config of their mechanism."""
    out = {f"kafka.{k}": v for k, v in options.items() if k not in (USERNAME, PASSWORD)}
    if USERNAME in options:
        out[f"kafka.{JAAS}"] = jaas_line(
            options["sasl.mechanism"], options[USERNAME], options[PASSWORD]
        )
    return out


def librdkafka(options: Mapping[str, str], own: Mapping[str, str] | None = None) -> dict[str, str]:
    """The options in librdkafka's names, then ``own`` (``kafka.librdkafka_options``) over them.
    What librdkafka has no counterpart for (a Java keystore, a login callback class) is left
    out: ``own`` says what the Python clients use instead (e.g. ssl.ca.location)."""
    out = {k: v for k, v in options.items() if k in SAME}
    if "ssl.endpoint.identification.algorithm" in options:  # (Java's "" is librdkafka's none)
        out["ssl.endpoint.identification.algorithm"] = (
            options["ssl.endpoint.identification.algorithm"] or "none"
        )
    if USERNAME in options:
        out[USERNAME], out[PASSWORD] = options[USERNAME], options[PASSWORD]
    elif JAAS in options:
        module, args = parse_jaas(options[JAAS]) or ("", {})
        if module in (PLAIN_MODULE, SCRAM_MODULE) and "username" in args:
            out[USERNAME], out[PASSWORD] = args["username"], args.get("password", "")
    # files and PEM text: librdkafka reads PEM (and PKCS#12 keystores), not Java's JKS
    truststore = options.get("ssl.truststore.type", "JKS").upper()
    if truststore == "PEM":
        if "ssl.truststore.location" in options:
            out["ssl.ca.location"] = options["ssl.truststore.location"]
        if "ssl.truststore.certificates" in options:
            out["ssl.ca.pem"] = options["ssl.truststore.certificates"]
    keystore = options.get("ssl.keystore.type", "JKS").upper()
    if keystore == "PKCS12":
        for key in ("ssl.keystore.location", "ssl.keystore.password"):
            if key in options:
                out[key] = options[key]
    elif keystore == "PEM":
        if "ssl.keystore.location" in options:  # the key and its certificate in one file
            out["ssl.certificate.location"] = options["ssl.keystore.location"]
            out["ssl.key.location"] = options["ssl.keystore.location"]
        if "ssl.keystore.certificate.chain" in options:
            out["ssl.certificate.pem"] = options["ssl.keystore.certificate.chain"]
        if "ssl.keystore.key" in options:
            out["ssl.key.pem"] = options["ssl.keystore.key"]
    return {**out, **(own or {})}


def read_properties(path: Path) -> dict[str, str]:
    """A Java properties file (``key=value``, ``key: value`` or ``key value`` lines; ``#`` and
    ``!`` comments; a line ending in a backslash continued on the next), as Kafka's tools read
    a ``client.properties``."""
    lines = path.read_text().splitlines()
    out: dict[str, str] = {}
    logical = ""
    for raw in lines:
        line = raw.lstrip()
        if not logical and (not line or line[0] in "#!"):
            continue
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2:  # continued on the next line
            logical += line[:-1]
            continue
        logical += line
        key, value = _split_property(logical)
        out[key] = value
        logical = ""
    if logical:
        key, value = _split_property(logical)
        out[key] = value
    return out


def _split_property(line: str) -> tuple[str, str]:
    i, key = 0, []
    while i < len(line) and line[i] not in "=: \t\f":
        if line[i] == "\\" and i + 1 < len(line):
            i += 1
        key.append(line[i])
        i += 1
    while i < len(line) and line[i] in " \t\f":
        i += 1
    if i < len(line) and line[i] in "=:":
        i += 1
    value = line[i:].lstrip(" \t\f")
    escapes = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}

    def unescape(found: re.Match) -> str:
        char = found[1]
        if char.startswith("u"):
            return chr(int(char[1:], 16))
        return escapes.get(char, char)

    return "".join(key), re.sub(r"\\(u[0-9a-fA-F]{4}|.)", unescape, value)
