"""How the ``echomq`` commands print values: durations, sizes, aligned tables, and the progress
bar (an age as ``--closed-age`` takes it: :func:`.arguments.fmt_seconds`)."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import IO


def fmt_ago(value: float | None) -> str:
    """A duration for reading, two units at most: ``42s``, ``5m07s``, ``3h05m``, ``2d03h``."""
    if value is None:
        return "-"
    secs = max(0, int(value))
    if secs < 60:
        return f"{value:.1f}s" if value < 10 else f"{secs}s"
    if secs < 3600:
        return f"{secs // 60}m{secs % 60:02d}s"
    if secs < 86_400:
        return f"{secs // 3600}h{secs % 3600 // 60:02d}m"
    return f"{secs // 86_400}d{secs % 86_400 // 3600:02d}h"


def fmt_bytes(value: float | None) -> str:
    """``812 B``, ``12.3 KiB``, ``4.5 MiB``, ``1.2 GiB``; ``-`` for None."""
    if value is None:
        return "-"
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{int(size)} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], *, left: int = 1) -> list[str]:
    """Rows of text cells as aligned lines: the first ``left`` columns to the left, the rest
    to the right (numbers), two spaces between columns, no trailing blanks."""
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]
    lines = []
    for row in [list(headers), *rows]:
        cells = [
            cell.ljust(w) if i < left else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    return lines


class Progress:
    """A progress bar on a text stream: one ``\\r``-redrawn line on a terminal; otherwise a line
    at each tenth crossed (at most one a second) and the last one, so logs stay readable."""

    WIDTH = 30

    def __init__(
        self,
        total: int,
        *,
        label: str = "settled",
        stream: IO[str] | None = None,
        enabled: bool = True,
    ) -> None:
        self.total = max(0, total)
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.tty = enabled and self.stream.isatty()
        self.started = time.monotonic()
        self._last_draw = 0.0
        self._last_tenth = -1
        self._open = False

    def line(self, done: int, note: str = "") -> str:
        total = self.total or 1
        filled = min(self.WIDTH, self.WIDTH * done // total)
        bar = "#" * filled + "-" * (self.WIDTH - filled)
        pct = 100 * done // total
        elapsed = time.monotonic() - self.started
        tail = f"  {note}" if note else ""
        return f"[{bar}] {done:,}/{self.total:,} {self.label} ({pct}%) {elapsed:.1f}s{tail}"

    def update(self, done: int, note: str = "", *, final: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if self.tty:
            if final or now - self._last_draw >= 0.1:
                self.stream.write("\r" + self.line(done, note) + "\x1b[K")
                self.stream.flush()
                self._last_draw, self._open = now, True
            return
        tenth = 10 * done // (self.total or 1)
        if final or (tenth > self._last_tenth and now - self._last_draw >= 1.0):
            self.stream.write(self.line(done, note) + "\n")
            self.stream.flush()
            self._last_draw, self._last_tenth = now, tenth

    def close(self) -> None:
        if self.enabled and self.tty and self._open:
            self.stream.write("\n")
            self.stream.flush()
            self._open = False
