"""Landing files as bronze reads them, without Spark: compressed by their name's suffix (the
codecs Spark's text source takes), and the ones that cannot be read whole.

A compressed file that does not decompress to its end (truncated, corrupted, not what its name
says) is unreadable: bronze quarantines it whole, in one row naming the decoder's error, and
the proof expects that row; its lines are not taken one by one, since how far each decoder gets
into a damaged file is its own."""

from __future__ import annotations

import bz2
import gzip
import zlib
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote, urlparse

from lakehouse.errors import LakehouseError

CHUNK = 1 << 20  # decompressed bytes at a time: a large file is checked in constant memory
COMPRESSED = (".gz", ".bz2", ".deflate")
UNREADABLE = "unreadable_file"  # the quarantine reason of such a file


class UnreadableFile(LakehouseError, ValueError):
    """A compressed landing file that does not decompress to its end."""


def _deflate(path: Path) -> Iterator[bytes]:
    """A zlib stream (Hadoop's ``.deflate``), decompressed chunk by chunk."""
    stream = zlib.decompressobj()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            yield stream.decompress(block)
    yield stream.flush()
    if not stream.eof:
        raise EOFError("the stream ends before its end marker")


def _opened(path: Path, opener) -> Iterator[bytes]:
    with opener(path, "rb") as f:
        while block := f.read(CHUNK):
            yield block


def chunks(path: Path) -> Iterator[bytes]:
    """The file's bytes, decompressed when its name says so, in chunks; raises
    :class:`UnreadableFile` (with the decoder's error) when they stop before the end."""
    suffix = path.suffix
    if suffix not in COMPRESSED:
        yield path.read_bytes()
        return
    if suffix == ".deflate":
        blocks = _deflate(path)
    else:
        blocks = _opened(path, gzip.open if suffix == ".gz" else bz2.open)
    try:
        yield from blocks
    except (OSError, EOFError, zlib.error) as exc:
        codec = suffix.lstrip(".")
        raise UnreadableFile(
            f"{codec} data that does not decompress to its end "
            f"({type(exc).__name__}: {exc}); {path.stat().st_size:,} bytes, kept in the "
            "landing file"
        ) from None


def read(path: Path) -> bytes:
    """The file's bytes, decompressed when its name says so; :class:`UnreadableFile`."""
    return b"".join(chunks(path))


def unreadable(path: Path) -> str | None:
    """Why the file cannot be read whole (None: it can). Only compressed files are read."""
    if path.suffix not in COMPRESSED:
        return None
    try:
        for _ in chunks(path):
            pass
    except UnreadableFile as exc:
        return str(exc)
    return None


def spark_name(uri: str) -> str:
    """A landing file's URI as a file source's log spells it (``file:///x/a%20b``) in the
    spelling of Spark's ``_metadata.file_path`` (``file:/x/a%20b``), which the lines'
    ``_source_file`` holds."""
    parts = urlparse(uri)
    return f"{parts.scheme}:{parts.path}" if not parts.netloc and parts.scheme else uri


def local_path(uri: str) -> Path:
    """A landing file's path from the URI Spark names it by (``file:///...``, %-encoded)."""
    return Path(unquote(urlparse(uri).path))
