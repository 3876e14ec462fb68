"""A small S3 client on the standard library: objects put (with put-if-absent), read, listed
and deleted, each request signed with AWS Signature Version 4.

It is what ``lakehouse objectstore`` needs to know that its store serves a bucket, and what a
lock object on a bucket needs: S3's conditional create (``If-None-Match: *``), which answers
412 when the key exists. Spark reaches the store through Hadoop's S3A, delta-rs and pyarrow
through their own clients; this one carries no data.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import http.client
import urllib.parse
from dataclasses import dataclass, field
from xml.etree import ElementTree

from lakehouse.errors import LakehouseError

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


class S3Error(LakehouseError):
    """A request the store refused or could not answer: its status and S3's error code."""

    def __init__(self, message: str, status: int = 0, code: str = ""):
        super().__init__(message)
        self.status = status
        self.code = code


class Exists(S3Error):
    """A put-if-absent found the key there already (412 Precondition Failed)."""


@dataclass(frozen=True)
class Response:
    status: int
    headers: dict[str, str]
    body: bytes


@dataclass(frozen=True)
class Bucket:
    """A bucket of an S3 endpoint (``http://127.0.0.1:8333``), addressed path-style."""

    endpoint: str
    name: str
    access_key: str
    secret_key: str = field(repr=False)
    region: str = "us-east-1"
    timeout_s: float = 30.0

    # ---- objects -----------------------------------------------------------------------
    def put(self, key: str, body: bytes, *, if_absent: bool = False) -> str:
        """Store ``body`` at ``key``; its ETag. With ``if_absent`` the store creates it only
        when no object has that key, else raises :class:`Exists`."""
        headers = {"If-None-Match": "*"} if if_absent else {}
        got = self.request("PUT", key, body=body, headers=headers)
        if got.status == 412:
            raise Exists(f"s3://{self.name}/{key} exists already", 412, "PreconditionFailed")
        self._check(got, "PUT", key)
        return got.headers.get("etag", "")

    def get(self, key: str) -> bytes | None:
        """The object's bytes, None when there is none."""
        got = self.request("GET", key)
        if got.status == 404:
            return None
        self._check(got, "GET", key)
        return got.body

    def delete(self, key: str) -> None:
        """Remove the object (nothing when there is none)."""
        self._check(self.request("DELETE", key), "DELETE", key)

    def keys(self, prefix: str = "") -> list[str]:
        """The keys under ``prefix``, in order (every page of ListObjectsV2)."""
        found: list[str] = []
        token = ""
        while True:
            query = {"list-type": "2", "prefix": prefix}
            if token:
                query["continuation-token"] = token
            got = self.request("GET", "", query=query)
            self._check(got, "LIST", prefix)
            root = ElementTree.fromstring(got.body)
            ns = root.tag.partition("}")[0] + "}" if root.tag.startswith("{") else ""
            found += [e.text or "" for e in root.iter(f"{ns}Key")]
            token = root.findtext(f"{ns}NextContinuationToken") or ""
            if root.findtext(f"{ns}IsTruncated") != "true" or not token:
                return found

    def exists(self) -> bool:
        """The bucket is there and these credentials may read it."""
        got = self.request("HEAD", "")
        if got.status in (200, 404):
            return got.status == 200
        self._check(got, "HEAD", "")
        return False

    # ---- the signed request ------------------------------------------------------------
    def request(
        self,
        method: str,
        key: str,
        *,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
        query: dict[str, str] | None = None,
    ) -> Response:
        """One signed request on the bucket (``key`` "" is the bucket itself)."""
        url = urllib.parse.urlsplit(self.endpoint)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise S3Error(f"the endpoint {self.endpoint!r} is not an http(s):// URL")
        path = "/" + urllib.parse.quote(self.name) + ("/" + urllib.parse.quote(key) if key else "")
        canonical_query = "&".join(
            f"{urllib.parse.quote(k, safe='-_.~')}={urllib.parse.quote(v, safe='-_.~')}"
            for k, v in sorted((query or {}).items())
        )
        now = dt.datetime.now(dt.UTC)
        stamp = now.strftime("%Y%m%dT%H%M%SZ")
        digest = hashlib.sha256(body).hexdigest() if body else EMPTY_SHA256
        default_port = 443 if url.scheme == "https" else 80
        host = url.hostname + (f":{url.port}" if url.port and url.port != default_port else "")
        signed = {
            "host": host,
            "x-amz-content-sha256": digest,
            "x-amz-date": stamp,
            **{k.lower(): v for k, v in (headers or {}).items()},
        }
        names = ";".join(sorted(signed))
        canonical = "\n".join(
            [method, path, canonical_query]
            + [f"{k}:{signed[k].strip()}" for k in sorted(signed)]
            + ["", names, digest]
        )
        scope = f"{stamp[:8]}/{self.region}/s3/aws4_request"
        to_sign = "\n".join(
            ["AWS4-HMAC-SHA256", stamp, scope, hashlib.sha256(canonical.encode()).hexdigest()]
        )
        key_bytes = ("AWS4" + self.secret_key).encode()
        for part in (stamp[:8], self.region, "s3", "aws4_request"):
            key_bytes = hmac.new(key_bytes, part.encode(), hashlib.sha256).digest()
        signature = hmac.new(key_bytes, to_sign.encode(), hashlib.sha256).hexdigest()
        sent = {("Host" if k == "host" else k): v for k, v in signed.items()}
        sent["Authorization"] = (
            f"AWS4-HMAC-SHA256 Credential={self.access_key}/{scope}, "
            f"SignedHeaders={names}, Signature={signature}"
        )
        connection_type = (
            http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
        )
        connection = connection_type(url.hostname, url.port, timeout=self.timeout_s)
        target = path + (f"?{canonical_query}" if canonical_query else "")
        try:
            connection.request(method, target, body=body or None, headers=sent)
            answer = connection.getresponse()
            data = answer.read()
        except OSError as exc:
            raise S3Error(f"the object store at {self.endpoint} did not answer: {exc}") from None
        finally:
            connection.close()
        return Response(answer.status, {k.lower(): v for k, v in answer.getheaders()}, data)

    def _check(self, got: Response, what: str, key: str) -> None:
        if got.status < 300:
            return
        code = message = ""
        if got.body.startswith(b"<"):
            try:
                root = ElementTree.fromstring(got.body)
                code = root.findtext("Code") or ""
                message = root.findtext("Message") or ""
            except ElementTree.ParseError:
                pass
        why = ": ".join(part for part in (code, message) if part) or f"HTTP {got.status}"
        raise S3Error(f"{what} s3://{self.name}/{key} was refused: {why}", got.status, code)
