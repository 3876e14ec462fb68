"""Landing files as bronze reads them, without Spark: compressed by their name's suffix (the
codecs Spark's text source takes), and the ones that cannot be read whole.

A compressed file that does not decompress to its end (truncated, corrupted, not what its name
says) is unreadable: bronze quarantines it whole, in one row naming the decoder's error, and
the proof expects that row; its lines are not taken one by one, since how far each decoder gets
into a damaged file is its own."""

from __future__ import annotations

import bz2
import gzip
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from lakehouse.errors import LakehouseError

CHUNK = 1 << 20  # decompressed bytes at a time: a large file is checked in constant memory
COMPRESSED = (".gz", ".bz2", ".deflate")
UNREADABLE = "unreadable_file"  # the quarantine reason of such a file
BOM = b"\xef\xbb\xbf"


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
        yield from _opened(path, open)
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


@dataclass(frozen=True)
class LongLine:
    number: int  # 1 = the file's first line
    size: int  # its bytes, without its line end (nor a byte-order mark)


@dataclass(frozen=True)
class FileCheck:
    """What bronze quarantines of a landing file instead of reading it: the whole file when it
    is ``unreadable`` (why), else its ``long`` lines, which Spark skips."""

    unreadable: str | None = None
    long: tuple[LongLine, ...] = ()


def check(path: Path, max_line_bytes: int) -> FileCheck:
    """Read a landing file in constant memory: a compressed one always (whether it
    decompresses to its end), a plain one only when it is large enough to hold a line of
    ``max_line_bytes`` bytes (with its line end). Lines end at ``\\n``, ``\\r\\n`` or
    ``\\r``, as Hadoop's line reader ends them, which skips a line whose bytes with its end
    reach its limit (a byte-order mark that starts the file not counted)."""
    if path.suffix not in COMPRESSED and path.stat().st_size < max_line_bytes:
        return FileCheck()
    try:
        return FileCheck(long=tuple(long_lines(chunks(path), max_line_bytes)))
    except UnreadableFile as exc:
        return FileCheck(unreadable=str(exc))


_LINE_END = re.compile(rb"\r\n|\r|\n")


def long_lines(blocks: Iterator[bytes], limit: int) -> Iterator[LongLine]:
    """The lines of ``blocks`` whose bytes with their end reach ``limit``."""
    number, size, end, pending_cr, head = 0, 0, 0, False, b""

    def close() -> LongLine | None:
        nonlocal number, size, end
        number += 1
        if number == 1 and head.startswith(BOM):
            size -= len(BOM)
        line = LongLine(number, size - end) if size >= limit else None
        size, end = 0, 0
        return line

    for block in blocks:
        if len(head) < len(BOM):
            head += block[: len(BOM) - len(head)]
        at = 0
        if pending_cr:  # a "\r" that ended the last block: a "\n" may complete it
            pending_cr = False
            if block[:1] == b"\n":
                size, end, at = size + 1, end + 1, 1
            if line := close():
                yield line
        for match in _LINE_END.finditer(block, at):
            size, end = size + match.end() - at, match.end() - match.start()
            at = match.end()
            if at == len(block) and match.group() == b"\r":
                pending_cr = True
                break
            if line := close():
                yield line
        else:
            size += len(block) - at
    if (pending_cr or size) and (line := close()):
        yield line


def spark_name(uri: str) -> str:
    """A landing file's URI as a file source's log spells it (``file:///x/a%20b``) in the
    spelling of Spark's ``_metadata.file_path`` (``file:/x/a%20b``), which the lines'
    ``_source_file`` holds."""
    parts = urlparse(uri)
    return f"{parts.scheme}:{parts.path}" if not parts.netloc and parts.scheme else uri


def local_path(uri: str) -> Path:
    """A landing file's path from the URI Spark names it by (``file:///...``, %-encoded)."""
    return Path(unquote(urlparse(uri).path))
