"""What every ``echomq`` command shares: argument types, connection options, one-line errors,
the progress bar.

Errors: a command raises; :func:`echomq_core.cli.main` turns the exception into ONE line on
stderr and an exit status (:func:`exit_status`): 2 for usage (a bad argument, a malformed URL,
a refused queue name or id), 1 for runtime (the server cannot be reached, the flow failed or
did not settle in time), 130 for Ctrl-C. No traceback unless ``-v`` is given twice.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from typing import IO, Any, NoReturn

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from ..client import DEFAULT_URL, EchoMQ
from ..connection import Call
from ..errors import ConfigurationError, EchoMQError, InvalidInput

USAGE, RUNTIME, INTERRUPTED = 2, 1, 130


class UsageError(Exception):
    """A bad command line (argparse's complaint, or a check of ours): exit status 2."""


class CommandFailed(Exception):
    """The command ran and its outcome is a failure (already explained): exit status 1."""


class Parser(argparse.ArgumentParser):
    """argparse, but an error is one line (argparse prints the whole usage block)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: error: {message} (see '{self.prog} --help')")


def exit_status(exc: BaseException) -> int:
    if isinstance(exc, UsageError | ConfigurationError | InvalidInput):
        return USAGE
    if isinstance(exc, KeyboardInterrupt):
        return INTERRUPTED
    return RUNTIME


def one_line(exc: BaseException) -> str:
    """The message of ``exc`` on one line: multi-line messages (a server's log tail) keep their
    first and last lines, where the summary and the actual reason are."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    text = lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"
    if isinstance(exc, redis.RedisError | OSError) and not isinstance(exc, EchoMQError):
        text = f"{type(exc).__name__}: {text}"
    return text if len(text) <= 600 else text[:597] + "..."


# -- argument types -----------------------------------------------------------------------


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


def seconds(low: float = 0.0) -> Any:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
        if not value >= low or value == float("inf"):
            raise argparse.ArgumentTypeError(f"must be a number of seconds >= {low}, got {text}")
        return value

    return parse


def add_connection_options(parser: argparse.ArgumentParser, *, url_default: str | None) -> None:
    group = parser.add_argument_group("connection")
    shown = url_default or "a bundled server started for the run"
    group.add_argument(
        "--url",
        default=url_default,
        help="server URL: redis://, rediss://, unix://, redis+cluster:// "
        f"(default: $ECHOMQ_URL, else {shown})",
    )
    group.add_argument(
        "--prefix",
        default=os.environ.get("ECHOMQ_PREFIX", "emq"),
        help="key prefix (default: $ECHOMQ_PREFIX, else %(default)s)",
    )
    group.add_argument(
        "--connect-timeout",
        type=seconds(0.01),
        default=5.0,
        metavar="S",
        help="give up reaching the server after S seconds (default %(default)s)",
    )


def add_verbosity(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="log more (-v info, -vv debug and tracebacks)",
    )


def env_url() -> str:
    return os.environ.get("ECHOMQ_URL") or DEFAULT_URL


def setup_logging(verbose: int) -> None:
    level = logging.WARNING if verbose <= 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(
        level=level, stream=sys.stderr, format="echomq: %(levelname)s %(name)s: %(message)s"
    )


def open_client(
    args: argparse.Namespace, *, url: str | None = None, socket_timeout: float | None = 30.0
) -> EchoMQ:
    """A client for ``args.url`` that is known to answer.

    A first client without retries and with ``--connect-timeout`` on every socket operation
    sends PING, so a wrong host, a closed port or a server that accepts and never answers
    fails in about that time, in one line - instead of redis-py's retries with backoff. The
    client returned has the connector's defaults: no blind re-sends (a worker and a Pump ride
    out a restart through their own bounded retry loops; see :mod:`echomq_core.connection`).
    """
    target = url or args.url
    timeout = args.connect_timeout
    probe = EchoMQ(
        target,
        prefix=args.prefix,
        socket_connect_timeout=timeout,
        socket_timeout=timeout,
        retry=Retry(NoBackoff(), 0),
    )
    try:
        probe.connection.execute([Call.cmd("PING")])
    finally:
        probe.close()
    return EchoMQ(
        target, prefix=args.prefix, socket_connect_timeout=timeout, socket_timeout=socket_timeout
    )


# -- progress -----------------------------------------------------------------------------


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
