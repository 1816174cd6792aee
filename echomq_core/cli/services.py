"""The long-running commands: ``echomq server``, ``echomq worker``, ``echomq pump``.

Each runs in the foreground until SIGTERM or SIGINT. The worker then drains: it stops
claiming, gives unstarted jobs back, says which jobs are in flight and lets their handlers
finish (up to ``--grace`` seconds); a second signal gives back the running jobs at once (their
leases released: another worker claims them at once). Exit status 0 after SIGTERM, 130 after
Ctrl-C (SIGINT), as for every command.

At start, every read and write (the server's answer, the queues' shard configuration, their
registration) waits while the server cannot take it yet - unreachable, a Cluster master in
failover, full (``maxmemory``) - for up to ``--wait-for-server`` seconds in all, logging what
it waits for (:func:`~echomq_core.wire.patience.patiently`).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..client.async_client import AsyncEchoMQ
from ..control.options import PumpOptions, WorkerOptions, add_flags, from_namespace
from ..errors import ConfigurationError
from ..hooks import Handler, Hooks, LifecycleHooks, plugin_manager
from ..pump.pump import Pump
from ..server import EmbeddedServer
from ..wire.patience import patiently
from ..work.async_worker import AsyncWorker
from ..work.worker import Worker
from .arguments import add_bind_options, int_at_least, seconds
from .common import (
    INTERRUPTED,
    CommandFailed,
    UsageError,
    add_command,
    add_verbosity,
    bundled_binary,
    log,
    open_client,
)
from .metrics_option import add_metrics_option, start_metrics


def add_parsers(sub: Any) -> None:
    _add_server(sub)
    _add_worker(sub)
    _add_pump(sub)


def _add_server(sub: Any) -> None:
    s = sub.add_parser(
        "server",
        help="run the bundled Valkey server in the foreground",
        description="Run the bundled valkey-server in the foreground and print "
        "its URL (first line of stdout). Persistence (append-only "
        "file) is on unless --no-persistence. Stops on SIGTERM/SIGINT.",
    )
    add_bind_options(s, port=6379)
    s.add_argument(
        "--data-dir",
        default="echomq-data",
        metavar="DIR",
        help="where the append-only file lives (default ./%(default)s)",
    )
    s.add_argument(
        "--no-persistence",
        action="store_true",
        help="keep data in memory only (a temporary directory, removed at exit)",
    )
    s.add_argument(
        "--appendfsync",
        choices=("always", "everysec", "no"),
        default="everysec",
        help="fsync policy of the append-only file (default %(default)s)",
    )
    add_verbosity(s)
    s.set_defaults(invoke=run_server)


def _add_worker(sub: Any) -> None:
    w = sub.add_parser(
        "worker",
        help="run job handlers for queues",
        description="Run handlers for QUEUEs (default: every queue that has a "
        "handler). Handlers come from --app and from plugins "
        "(the echomq_handlers hook). SIGTERM or Ctrl-C drains gracefully (running jobs get "
        "--grace seconds); a second one gives the running jobs back at once. Exit status 0 "
        "after SIGTERM, 130 after Ctrl-C.",
    )
    w.add_argument("queues", nargs="*", metavar="QUEUE", help="queues to work on")
    w.add_argument(
        "--app",
        action="append",
        default=[],
        metavar="MODULE:OBJECT",
        help="a {queue: handler} mapping, or a callable returning one (the current "
        "directory is importable); repeatable",
    )
    w.add_argument(
        "--async",
        dest="use_async",
        action="store_true",
        help="run the handlers on one asyncio event loop (AsyncWorker): async handlers are "
        "awaited, --concurrency of them at once; sync ones run in a pool of that many threads",
    )
    w.add_argument(
        "--no-pump",
        dest="pump",
        action="store_false",
        help="do not drain these queues' outboxes, recover their leases or sweep their "
        "retention in this process (leave it to `echomq pump`)",
    )
    w.add_argument(
        "--batch",
        dest="batch_specs",
        action="append",
        default=[],
        type=batch_spec,
        metavar="N|QUEUE=N",
        help="jobs per handler call: above 1 the handler gets a list of up to N jobs of one "
        "queue and returns a list of their results; QUEUE=N for one queue, N for every other "
        "(default 1: a job per call); repeatable",
    )
    _add_service_options(w, WorkerOptions, run_worker)


def _add_pump(sub: Any) -> None:
    p = sub.add_parser(
        "pump",
        help="deliver cross-queue fan-in signals, promote, recover",
        description="Run the Pump for QUEUEs (default: every queue in the "
        "registry, re-read every few seconds). Stops on SIGTERM (exit status 0) or "
        "Ctrl-C (130).",
    )
    p.add_argument("queues", nargs="*", metavar="QUEUE", help="queues to serve")
    _add_service_options(p, PumpOptions, run_pump)


def _add_service_options(parser: argparse.ArgumentParser, options: Any, run: Any) -> None:
    """What ``echomq worker`` and ``echomq pump`` both take after their own arguments: the
    flags of their settings (``options``: :class:`WorkerOptions` or :class:`PumpOptions`),
    the metrics and plugin options, and the connection ones with ``--wait-for-server``."""
    add_flags(parser, options, types=FLAG_TYPES)
    add_metrics_option(parser)
    _plugin_options(parser)
    add_command(parser, run, wait_for_server=True)


#: argparse converters for the settings' ranges (options.add_flags makes the flags).
FLAG_TYPES = {"int": int_at_least, "seconds": seconds}


def batch_spec(text: str) -> tuple[str | None, int]:
    """``--batch N`` (every queue) or ``--batch QUEUE=N`` (one queue): (queue or None, N)."""
    queue, _, size = text.rpartition("=")
    if _ and not queue:
        raise argparse.ArgumentTypeError(f"expected N or QUEUE=N, got {text!r}")
    return (queue or None), int_at_least(1, 5000)(size)


def _batches(
    args: argparse.Namespace, options: WorkerOptions
) -> tuple[WorkerOptions, dict[str, int]]:
    """The worker's options with ``--batch N`` applied, and the ``--batch QUEUE=N`` sizes."""
    per_queue = {q: n for q, n in args.batch_specs if q is not None}
    every = [n for q, n in args.batch_specs if q is None]
    if every:
        options = dataclasses.replace(options, batch=every[-1])
    return options, per_queue


def _plugin_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("plugins")
    group.add_argument(
        "--plugin",
        action="append",
        default=[],
        metavar="MODULE[:OBJECT]",
        help="register this plugin too (repeatable)",
    )
    group.add_argument(
        "--no-plugins",
        action="store_true",
        help="do not load plugins from the echomq.plugins entry point group",
    )


class _Stop(threading.Event):
    """An event set by SIGTERM or SIGINT; ``signum`` is the first signal that set it."""

    signum: int | None = None


def _stop_event() -> _Stop:
    """A :class:`_Stop` set by SIGTERM or SIGINT."""
    stop = _Stop()

    def handler(signum: int, frame: Any) -> None:
        if stop.signum is None:
            stop.signum = signum
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, handler)
    return stop


def _say(text: str) -> None:
    print(f"echomq {text}", file=sys.stderr, flush=True)


# -- server --------------------------------------------------------------------------------


def run_server(args: argparse.Namespace) -> int:
    data_dir = None if args.no_persistence else Path(args.data_dir).resolve()
    server = EmbeddedServer(
        args.port or None,
        binary=bundled_binary("echomq server"),
        host=args.host,
        data_dir=data_dir,
        appendonly=not args.no_persistence,
        appendfsync=args.appendfsync,
    )
    stop = _stop_event()
    server.start()
    try:
        print(server.url, flush=True)
        where = (
            f"append-only file in {server.data_dir} (fsync {args.appendfsync})"
            if data_dir is not None
            else "in memory only"
        )
        _say(
            f"server: {server.binary.name} pid {server.pid} on {server.url}, {where}; "
            "SIGTERM or Ctrl-C stops it"
        )
        while not stop.wait(0.5):
            if not server.is_running():
                raise CommandFailed(f"the server exited unexpectedly; see {server.log_path}")
        _say("server: stopping")
    finally:
        server.stop()
    return 0


# -- worker --------------------------------------------------------------------------------


def _import(spec: str, *, what: str, need_object: bool) -> Any:
    module_name, _, attr = spec.partition(":")
    if not module_name or (need_object and not attr):
        raise UsageError(f"{what} must be MODULE:OBJECT, got {spec!r}")
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)  # as `python -m` would: the project being run is importable
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split(".") if attr else ():
            obj = getattr(obj, part)
    except Exception as exc:
        raise ConfigurationError(
            f"{what} {spec!r} cannot be imported: {type(exc).__name__}: {exc}"
        ) from exc
    return obj


def _app_handlers(spec: str) -> dict[str, Handler]:
    obj = _import(spec, what="--app", need_object=True)
    if not isinstance(obj, Mapping) and callable(obj):
        obj = obj()
    if not isinstance(obj, Mapping):
        raise ConfigurationError(
            f"--app {spec!r} is a {type(obj).__name__}, not a mapping of "
            "queue names to handlers (or a callable returning one)"
        )
    return dict(obj)


def _hooks(args: argparse.Namespace, mq: Any) -> Hooks:
    plugins = [_import(spec, what="--plugin", need_object=False) for spec in args.plugin]
    return Hooks(plugin_manager(*plugins, entry_points=not args.no_plugins), client=mq)


def _status(signum: int | None) -> int:
    """The exit status of a command stopped by ``signum``: 130 after Ctrl-C (SIGINT), as
    :func:`~echomq_core.cli.common.exit_status` gives every interrupted command; else 0."""
    return INTERRUPTED if signum == signal.SIGINT else 0


def _left(args: argparse.Namespace, began: float) -> float:
    """What is left of ``--wait-for-server`` (one bound for every start-up step)."""
    return max(0.0, float(args.wait_for_server) - (time.monotonic() - began))


def run_worker(args: argparse.Namespace) -> int:
    apps = [_app_handlers(spec) for spec in args.app]  # import errors before connecting
    began = time.monotonic()
    mq = open_client(args, socket_timeout=60.0)
    try:
        hooks = _hooks(args, mq)
        chosen = _chosen_handlers(args, apps, hooks)
        names = hooks.plugin_names()
        lifecycle: LifecycleHooks | None = hooks if names else None
        metrics = start_metrics(args)
        options, per_queue = _batches(args, from_namespace(WorkerOptions, args))
        if metrics:  # a batch handler's call is timed once, its failed jobs counted each
            chosen = metrics.wrap_handlers(chosen)
        lifecycle = metrics.hooks(lifecycle) if metrics else lifecycle
        # the worker is made (its handlers and options checked) before anything is said
        worker: Worker | AsyncWorker
        settings: dict[str, Any] = dict(
            options=options,
            hooks=lifecycle,
            pump=args.pump,
            batch=per_queue,
            wait_for_server=_left(args, began),
        )
        if args.use_async:
            amq = AsyncEchoMQ(
                args.url,
                prefix=args.prefix,
                socket_connect_timeout=args.connect_timeout,
                socket_timeout=60.0,
            )
            worker = AsyncWorker(amq, chosen, **settings)
        else:
            worker = Worker(mq, chosen, **settings)
        if metrics:
            metrics.watch_worker(worker)
        _say(
            f"worker: queues {', '.join(chosen)}; concurrency {args.concurrency}"
            f"{' (asyncio)' if args.use_async else ''}; "
            f"{_batch_text(chosen, per_queue, options.batch)}"
            f"{mq.connection.where} prefix {mq.keys.prefix}; plugins: "
            f"{', '.join(names) or 'none'}"
        )
        try:
            if isinstance(worker, AsyncWorker):
                asyncio.run(_run_async(worker))
            else:
                worker.run()
        finally:
            if metrics:
                metrics.close()
        done = (worker.completed, worker.failed)
        _say(f"worker: stopped ({done[0]} completed, {done[1]} failed attempts)")
    finally:
        mq.close()
    if isinstance(worker, AsyncWorker) and worker.halted:
        # the sync handlers given back still run in the pool's threads, which the interpreter
        # joins at exit: a second Ctrl-C must not wait for them (their jobs are given back)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(INTERRUPTED)
    return _status(worker.signalled)


def _chosen_handlers(
    args: argparse.Namespace, apps: list[dict[str, Handler]], hooks: Hooks
) -> dict[str, Callable[..., Any]]:
    """The handlers of the queues the worker serves (``args.queues``, else every queue with
    one), from ``--app`` and the plugins; a queue with two, or none at all, is refused."""
    handlers: dict[str, Handler] = {}
    source: dict[str, str] = {}
    for spec, found in [
        *((f"--app {s}", a) for s, a in zip(args.app, apps, strict=True)),
        ("plugins", hooks.handlers()),
    ]:
        for queue, fn in found.items():
            if queue in handlers:
                raise ConfigurationError(
                    f"queue {queue!r} has handlers from {source[queue]} and {spec}"
                )
            handlers[queue], source[queue] = fn, spec
    if not handlers:
        raise UsageError(
            "no handlers: give --app MODULE:OBJECT or install a plugin that "
            "implements echomq_handlers"
        )
    missing = [q for q in args.queues if q not in handlers]
    if missing:
        raise UsageError(
            f"no handler for queue(s) {', '.join(map(repr, missing))} "
            f"(handlers exist for {', '.join(sorted(handlers))})"
        )
    chosen: dict[str, Callable[..., Any]] = (
        {q: handlers[q] for q in args.queues} if args.queues else handlers
    )
    return chosen


def _batch_text(chosen: Mapping[str, Any], per_queue: Mapping[str, int], every: int) -> str:
    """``batch score=256; `` (the queues whose handler takes lists), or nothing."""
    sizes = {q: per_queue.get(q, every) for q in chosen}
    shown = ", ".join(f"{q}={n}" for q, n in sizes.items() if n > 1)
    return f"batch {shown}; " if shown else ""


async def _run_async(worker: AsyncWorker) -> None:
    """``echomq worker --async``: the :class:`AsyncWorker` on its own asyncio client (the same
    URL, prefix and timeouts as the sync one, which the hooks keep using)."""
    try:
        await worker.run()
    finally:
        await worker.client.close()


# -- pump ----------------------------------------------------------------------------------


def run_pump(args: argparse.Namespace) -> int:
    began = time.monotonic()
    mq = open_client(args, socket_timeout=60.0)
    try:
        hooks = _hooks(args, mq)
        names = hooks.plugin_names()
        lifecycle = hooks if names else None
        metrics = start_metrics(args, mq, args.queues or None)
        # a sharded queue is pumped on every shard (its outboxes are the shards')
        served = (
            patiently(
                lambda: [s for q in args.queues for s in mq.shards(q)],
                what=f"pump: reading the shard configuration of {', '.join(args.queues)}",
                bound=_left(args, began),
                is_cluster=mq.connection.is_cluster,
                logger=log,
            )
            if args.queues
            else None
        )
        pump = Pump(
            mq,
            served,
            options=from_namespace(PumpOptions, args),
            hooks=metrics.hooks(lifecycle) if metrics else lifecycle,
        )
        if metrics:
            metrics.watch_pump(pump)
        stop = _stop_event()
        _say(
            f"pump: queues {', '.join(args.queues) or '(discovered)'}; "
            f"{mq.connection.where} prefix {mq.keys.prefix}; plugins: "
            f"{', '.join(names) or 'none'}"
        )
        pump.start()
        try:
            while not stop.wait(0.5):
                if not pump.running:
                    raise CommandFailed("the pump stopped unexpectedly (see the log above)")
        finally:
            pump.stop()
            if metrics:
                metrics.close()
        t = pump.totals
        _say(
            f"pump: stopped ({t.delivered} delivered, {t.poisoned} poisoned, {t.promoted} "
            f"promoted, {t.recovered} recovered, {t.buried} buried)"
        )
    finally:
        mq.close()
    return _status(stop.signum)
