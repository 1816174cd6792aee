"""``--metrics-port`` of ``echomq worker`` and ``echomq pump``: the process's Prometheus
metrics (see :mod:`echomq_core.seeing.metrics`), served from a thread of the process itself.

prometheus-client is imported only when the flag is given, so a worker without it needs only
``pip install echomq``; given the flag without the ``metrics`` extra, the command refuses to
start with one line saying what to install.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..errors import ConfigurationError
from .arguments import int_at_least

if TYPE_CHECKING:
    from ..seeing.process_metrics import ProcessMetrics


def add_metrics_option(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("metrics")
    group.add_argument(
        "--metrics-port",
        type=int_at_least(0, 65535),
        default=None,
        metavar="PORT",
        help="serve Prometheus metrics at http://HOST:PORT/metrics (needs echomq[metrics]; "
        "0 picks a free port, printed at start)",
    )
    group.add_argument(
        "--metrics-host",
        default="127.0.0.1",
        metavar="HOST",
        help="address the metrics server binds (default %(default)s)",
    )


def start_metrics(
    args: argparse.Namespace, client: Any = None, queues: Sequence[str] | None = None
) -> ProcessMetrics | None:
    """The process's metrics, served, or None without ``--metrics-port``. With ``client``
    (the Pump), the server-side gauges of ``queues`` (None: every registered queue) - the
    outbox lengths and the Pump's lag among them - are exported too."""
    if args.metrics_port is None:
        return None
    try:
        from ..seeing.metrics import QueueCollector
        from ..seeing.process_metrics import ProcessMetrics
    except ImportError as exc:
        raise ConfigurationError(
            f"--metrics-port needs prometheus-client: pip install 'echomq[metrics]' ({exc})"
        ) from exc
    metrics = ProcessMetrics()
    if client is not None:
        metrics.registry.register(QueueCollector(client, queues))
    try:
        server = metrics.serve(args.metrics_port, args.metrics_host)
    except OSError as exc:
        raise ConfigurationError(
            f"--metrics-port {args.metrics_port}: cannot listen on "
            f"{args.metrics_host}:{args.metrics_port}: {exc}"
        ) from exc
    url = f"http://{server.host}:{server.port}/metrics"
    print(f"echomq metrics: {url}", file=sys.stderr, flush=True)
    return metrics
