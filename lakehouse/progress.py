"""A progress line for long work: a bar redrawn in place on a terminal, one summary line
otherwise (logs of scheduled runs stay readable)."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """``update(done, total)`` as work advances, then ``done(message)`` once."""

    WIDTH = 30

    def __init__(self, label: str, stream: TextIO | None = None):
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.live = bool(getattr(self.stream, "isatty", lambda: False)())
        self.started = time.monotonic()
        self._last = 0.0

    def update(self, done: int, total: int) -> None:
        now = time.monotonic()
        if not self.live or (now - self._last < 0.1 and done < total):
            return
        self._last = now
        filled = self.WIDTH * done // max(total, 1)
        bar = "#" * filled + "." * (self.WIDTH - filled)
        self.stream.write(f"\r{self.label}: [{bar}] {done}/{total} {now - self.started:5.1f}s")
        self.stream.flush()

    def note(self, message: str) -> None:
        """Say what is under way (a terminal only), until the next update or done."""
        if self.live:
            self.stream.write(f"\r{self.label}: {message}")
            self.stream.flush()

    def done(self, message: str) -> None:
        end = "\r\033[K" if self.live else ""
        self.stream.write(f"{end}{self.label}: {message}\n")
        self.stream.flush()
