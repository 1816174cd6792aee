"""The ``echomq`` command.

::

    echomq demo [--children N] [--json] [--url URL]   one flow end to end (docs/getting-started.md)
    echomq server [--port P] [--data-dir DIR]          the bundled Valkey, in the foreground
    echomq worker [QUEUE ...] --app MODULE:OBJECT      run handlers (or plugins' handlers)
    echomq pump [QUEUE ...]                            deliver cross-queue signals, recover
    echomq worker ... [--timeout S]                    a time limit per handler call
    echomq worker ... [--batch N|QUEUE=N]              batch handlers: a list of N jobs a call
    echomq flow show QUEUE PARENT_ID [--watch]         a flow's state and counts, as a tree
    echomq flow ls [QUEUE] [--state S]                 root flows by state, paged
    echomq flow close QUEUE PARENT_ID                  a reader is done with a barrier flow
    echomq flow cancel QUEUE PARENT_ID [--reason R]    no unstarted child of the flow starts
    echomq flow retry QUEUE PARENT_ID [--ignored]      re-run what died (or never ran)
    echomq queue stats [QUEUE]                         counts per state, flows and their memory
    echomq queue config QUEUE [--closed-age 1d ...]    the queue's retention settings
    echomq poison list|replay QUEUE                    signals the Pump could not deliver
    echomq workers                                     the live worker processes
    echomq dashboard [--port P] [--actions]            the web dashboard and /metrics

Connection: ``--url`` (default ``$ECHOMQ_URL``, else ``redis://127.0.0.1:6379/0``),
``--prefix`` (``$ECHOMQ_PREFIX``, else ``emq``), ``--connect-timeout``; these and ``-v`` go
before the command or after it (``echomq --url X flow ls``). Every failure is one
line on stderr; exit status 2 for a bad command line (argument, URL, queue name, job id), 1
for a runtime failure (unreachable server, failed flow), 130 for Ctrl-C, 141 (nothing said)
when stdout's reader stops early (``echomq flow ls | head``), as a tool killed by SIGPIPE.
``-vv`` adds the traceback. argparse only: the command adds no dependency.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence

from ..errors import EchoMQError, ServerStartError, is_redis_error
from . import dashboard, demo, flow, poison, queue, services, workers
from .common import (
    INTERRUPTED,
    READER_GONE,
    SERVER_EXTRA,
    CommandFailed,
    Parser,
    UsageError,
    add_global_options,
    exit_status,
    one_line,
    settle_global_options,
    setup_logging,
)

log = logging.getLogger(__name__)

EPILOG = (
    "Connection options of every command that talks to a server: --url (default $ECHOMQ_URL, "
    "else redis://127.0.0.1:6379/0), --prefix ($ECHOMQ_PREFIX, else emq), --connect-timeout; "
    "before the command or after it. "
    "Exit status: 0 success, 1 runtime failure, 2 bad command line, 130 interrupted, "
    "141 stdout's reader stopped early (| head)."
)

#: Failures we expect and explain in one line (redis-py's errors too: ``is_redis_error``, so
#: that ``echomq --help`` does not import redis-py); anything else is a bug, reported as such.
EXPECTED = (
    EchoMQError,
    UsageError,
    CommandFailed,
    ServerStartError,
    OSError,
    ValueError,
)


def build_parser() -> Parser:
    from .. import __version__

    parser = Parser(
        prog="echomq",
        description="EchoMQ: durable fan-out / fan-in on Redis-protocol servers. Start with "
        f"'echomq demo': a flow on the bundled server ({SERVER_EXTRA} first), or on yours "
        "with --url.",
        epilog=EPILOG,
    )
    parser.add_argument("--version", action="version", version=f"echomq {__version__}")
    add_global_options(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    demo.add_parser(sub)
    services.add_parsers(sub)
    flow.add_parsers(sub)
    queue.add_parsers(sub)
    poison.add_parsers(sub)
    workers.add_parser(sub)
    dashboard.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the exit status (the ``echomq`` script exits with it).

    A reader that stops early (``echomq flow ls | head``) ends the command quietly with
    :data:`READER_GONE`, as a Unix tool killed by SIGPIPE does: the broken pipe is met at a
    write, or at the flush here (stdout into a pipe is buffered), never later at interpreter
    exit where Python would print "Exception ignored"."""
    try:
        try:
            return _run(argv)
        finally:
            # argparse's --help and --version exit through here too; no stdout at all (a
            # worker started with fd 1 closed) has nothing to flush
            if sys.stdout is not None and not sys.stdout.closed:
                sys.stdout.flush()
    except BrokenPipeError:
        return reader_gone()


def reader_gone() -> int:
    """The Python docs' recipe (library/signal.html, "Note on SIGPIPE"): point stdout at
    /dev/null so that the interpreter's last flush of what is still buffered does not fail
    again, and exit with :data:`READER_GONE`, saying nothing - the reader left on purpose."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout replaced by an object without a descriptor
        pass
    finally:
        os.close(devnull)
    return READER_GONE


def _run(argv: Sequence[str] | None) -> int:
    verbose = 0
    try:
        args = settle_global_options(build_parser().parse_args(argv))
        verbose = args.verbose
        setup_logging(verbose)
        status: int = args.invoke(args)
        return status
    except KeyboardInterrupt:
        print("echomq: interrupted", file=sys.stderr)
        return INTERRUPTED
    except BrokenPipeError:
        raise  # stdout's reader left (main): not an error to explain
    except Exception as exc:
        if verbose >= 2:
            log.exception("details")
        if isinstance(exc, EXPECTED) or is_redis_error(exc):
            text = one_line(exc)  # argparse's complaints come formatted: "echomq demo: error:"
            print(text if text.startswith("echomq") else f"echomq: error: {text}", file=sys.stderr)
            return exit_status(exc)
        # a bug: still one line, with the way to see more
        print(
            f"echomq: internal error: {type(exc).__name__}: {one_line(exc)} (run with -vv "
            "for the traceback)",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
