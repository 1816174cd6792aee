"""``echomq dashboard``: the web dashboard (see :mod:`echomq_core.dashboard`) on uvicorn.

Binds 127.0.0.1 unless ``--host`` says otherwise. Read-only unless ``--actions`` AND a token
(``$ECHOMQ_DASHBOARD_TOKEN`` or ``--token-file``: never a command-line argument, which every
user of the machine could read in the process list). Needs the ``dashboard`` extra.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path
from typing import Any

from ..errors import ConfigurationError
from .arguments import add_bind_options, add_seconds
from .common import UsageError, add_command, open_client

TOKEN_ENV = "ECHOMQ_DASHBOARD_TOKEN"


def add_parser(sub: Any) -> None:
    d = sub.add_parser(
        "dashboard",
        help="serve the web dashboard (and /metrics for Prometheus)",
        description="Serve the EchoMQ dashboard: queues at a glance, flows by state with "
        "progress, a flow's tree and children, dead jobs, poison, and /metrics (Prometheus). "
        "Read-only unless --actions and a token ($ECHOMQ_DASHBOARD_TOKEN or --token-file): "
        "then cancel, repair and close flows, retry dead jobs and replay poison, after "
        "signing in with the token. Needs: pip install 'echomq[dashboard]'.",
    )
    add_bind_options(d, port=8765)
    d.add_argument(
        "--actions",
        action="store_true",
        help="allow cancel, repair, close and replay (needs a token)",
    )
    d.add_argument(
        "--token-file",
        type=Path,
        default=None,
        metavar="PATH",
        help=f"file holding the token (default: ${TOKEN_ENV})",
    )
    add_seconds(
        d, "--poll", 0.2, 2.0, "seconds between the pages' live updates (default %(default)s)"
    )
    add_seconds(
        d,
        "--pending-alert",
        1.0,
        300.0,
        "highlight a queue whose oldest pending job is older than S seconds (default %(default)s)",
        high=30 * 86400,
    )
    add_command(d, run_dashboard)


def _token(args: argparse.Namespace) -> str | None:
    if args.token_file is not None:
        try:
            return args.token_file.read_text().strip() or None
        except OSError as exc:
            raise UsageError(f"--token-file {args.token_file}: {exc.strerror}") from exc
    return os.environ.get(TOKEN_ENV) or None


def run_dashboard(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from ..dashboard import create_app
    except ImportError as exc:
        raise ConfigurationError(
            f"echomq dashboard needs its extra: pip install 'echomq[dashboard]' ({exc})"
        ) from exc
    token = _token(args)
    if args.actions and token is None:
        raise UsageError(f"--actions needs a token: set ${TOKEN_ENV} or give --token-file")
    mq = open_client(args)
    try:
        app = create_app(
            mq,
            actions=args.actions,
            token=token,
            poll=args.poll,
            pending_alert=args.pending_alert,
        )
        family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((args.host, args.port))
        except OSError as exc:
            sock.close()
            raise ConfigurationError(
                f"cannot listen on {args.host}:{args.port}: {exc.strerror}"
            ) from exc
        port = sock.getsockname()[1]
        host = f"[{args.host}]" if family == socket.AF_INET6 else args.host
        print(f"http://{host}:{port}/", flush=True)
        mode = "actions on (sign in with the token)" if args.actions else "read-only"
        print(
            f"echomq dashboard: {mq.connection.where} prefix {mq.keys.prefix}; {mode}; "
            "Ctrl-C stops it",
            file=sys.stderr,
            flush=True,
        )
        config = uvicorn.Config(
            app, log_level="warning" if args.verbose <= 0 else "info", access_log=args.verbose > 0
        )
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        mq.close()
    return 0
