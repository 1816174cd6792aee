"""The argument types of the ``echomq`` commands (counts, seconds, ages with units, ``none``)
and the arguments several commands take alike."""

from __future__ import annotations

import argparse
import re
from typing import Any


def int_at_least(low: int, high: int | None = None) -> Any:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < low or (high is not None and value > high):
            bound = f"between {low} and {high}" if high is not None else f">= {low}"
            raise argparse.ArgumentTypeError(f"must be {bound}, got {value}")
        return value

    return parse


def add_bind_options(parser: argparse.ArgumentParser, port: int) -> None:
    """``--host`` (127.0.0.1 by default) and ``--port`` (0 picks a free one) of a server that
    a command runs (``echomq server``, ``echomq dashboard``)."""
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default %(default)s)")
    parser.add_argument(
        "--port",
        type=int_at_least(0, 65535),
        default=port,
        help="port; 0 picks a free one (default %(default)s)",
    )


def add_count(
    parser: Any, flag: str, low: int, high: int | None, default: int | None, help: str
) -> None:
    """An option ``flag N``: a whole number from ``low`` (up to ``high`` when given)."""
    parser.add_argument(flag, type=int_at_least(low, high), default=default, metavar="N", help=help)


def add_seconds(
    parser: Any, flag: str, low: float, default: Any, help: str, high: float | None = None
) -> None:
    """An option ``flag S``: a number of seconds from ``low`` (up to ``high`` when given)."""
    parser.add_argument(flag, type=seconds(low, high), default=default, metavar="S", help=help)


def add_queue(parser: argparse.ArgumentParser, help: str | None = None) -> None:
    """The QUEUE a command reads or writes."""
    parser.add_argument("queue", metavar="QUEUE", help=help)


def add_queue_or_all(parser: argparse.ArgumentParser) -> None:
    """An optional QUEUE: without it, the command reads every registered queue."""
    parser.add_argument("queue", nargs="?", metavar="QUEUE", help="one queue (default: all)")


def seconds(low: float = 0.0, high: float | None = None) -> Any:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
        if not value >= low or value == float("inf"):
            raise argparse.ArgumentTypeError(f"must be a number of seconds >= {low}, got {text}")
        if high is not None and value > high:
            raise argparse.ArgumentTypeError(f"must be at most {high:g} seconds, got {text}")
        return value

    return parse


#: The units an age may carry on the command line (``90``, ``90s``, ``15m``, ``12h``, ``7d``).
UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86_400}
_DURATION_RE = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*([smhd]?)")
NONE_WORDS = ("none",)


def age_or_none(high: float) -> Any:
    """An age: seconds (``90``, ``1.5``) or with a unit (``90s``, ``15m``, ``12h``, ``7d``), at
    most ``high`` seconds; ``none`` (no limit) gives None."""

    def parse(text: str) -> float | None:
        word = text.strip().lower()
        if word in NONE_WORDS:
            return None
        match = _DURATION_RE.fullmatch(word)
        if match is None:
            raise argparse.ArgumentTypeError(
                f"not an age: {text!r} (seconds, or a number with s, m, h or d; or none)"
            )
        value = float(match.group(1)) * UNITS[match.group(2)]
        if value > high:
            raise argparse.ArgumentTypeError(
                f"at most {fmt_seconds(high)} ({high:g}s), got {text!r}; say none for no limit"
            )
        return value

    return parse


def fmt_seconds(value: float | None) -> str:
    """An age as ``age_or_none`` reads it back: ``none``, ``7d``, ``12h``, ``15m``, ``90s``,
    ``1.5s`` (the largest unit that divides it exactly)."""
    if value is None:
        return "none"
    for unit in ("d", "h", "m"):
        size = UNITS[unit]
        if value >= size and value % size == 0:
            return f"{int(value // size)}{unit}"
    return f"{value:g}s" if value != int(value) else f"{int(value)}s"


def count_or_none(high: int) -> Any:
    """A count between 0 and ``high``; ``none`` (no limit) gives None."""
    as_int = int_at_least(0, high)

    def parse(text: str) -> int | None:
        if text.strip().lower() in NONE_WORDS:
            return None
        value: int = as_int(text.strip())
        return value

    return parse
