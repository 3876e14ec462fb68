"""What each engine needs to reach an S3 store, from the settings' ``[s3]`` section and the
usual AWS variables: Hadoop's S3A options for Spark (``s3a://`` paths), and the storage options
of delta-rs (``s3://`` or ``s3a://`` table URIs).

The keys are never settings and never enter Spark's configuration from here: Spark copies
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY`` and ``AWS_SESSION_TOKEN`` from its
environment into S3A's options when its context starts, and without them S3A asks its
provider chain (a machine's role on AWS). delta-rs skips the AWS chain when an endpoint is
given, so its options carry the keys of the environment: they are handed to it, never printed.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from lakehouse.settings import Settings

SCHEMES = ("s3a", "s3")
# Delta's log store for S3 with put-if-absent commits (jars/logstore, built by make setup)
LOG_STORE = "lakehouse.delta.S3ConditionalLogStore"


def is_s3(uri: str) -> bool:
    """``uri`` names an object of an S3 store (``s3a://`` or ``s3://``)."""
    return uri.partition("://")[0].lower() in SCHEMES and "://" in uri


def hadoop_conf(settings: Settings, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Spark's ``spark.hadoop.fs.s3a.*`` options for the settings' store (none for AWS S3 with
    its defaults)."""
    s3 = settings.s3
    endpoint = s3.resolved_endpoint(env)
    conf = {
        "spark.hadoop.fs.s3a.endpoint.region": s3.resolved_region(env),
        "spark.hadoop.fs.s3a.path.style.access": str(s3.path_style).lower(),
    }
    if endpoint:
        conf["spark.hadoop.fs.s3a.endpoint"] = endpoint
        if endpoint.lower().startswith("http://"):  # (without a scheme: S3A's TLS)
            conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] = "false"
        # a store of its own answers in its own region: no probe of AWS's others
        conf["spark.hadoop.fs.s3a.cross.region.access.enabled"] = "false"
    # s3:// paths through S3A too (Hadoop has no other s3 file system)
    conf["spark.hadoop.fs.s3.impl"] = "org.apache.hadoop.fs.s3a.S3AFileSystem"
    # Delta's commits put-if-absent, safe with writers in other processes (jars/logstore)
    for scheme in SCHEMES:
        conf[f"spark.delta.logStore.{scheme}.impl"] = LOG_STORE
    return conf


def storage_options(settings: Settings, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """delta-rs's options (object_store's AWS keys) for the settings' store."""
    env = os.environ if env is None else env
    s3 = settings.s3
    endpoint = s3.resolved_endpoint(env)
    options = {"AWS_REGION": s3.resolved_region(env)}
    if endpoint:
        options["AWS_ENDPOINT_URL"] = endpoint
        if endpoint.lower().startswith("http://"):
            options["AWS_ALLOW_HTTP"] = "true"
    options["AWS_VIRTUAL_HOSTED_STYLE_REQUEST"] = str(not s3.path_style).lower()
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        if env.get(key):
            options[key] = env[key]
    # commits are put-if-absent (object_store's default for S3, said so)
    options["AWS_CONDITIONAL_PUT"] = "etag"
    return options
