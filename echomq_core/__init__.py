"""EchoMQ: durable fan-out / fan-in for data pipelines on Redis-protocol servers.

What this package exports (``__all__``) is the public API: the clients, the queue and flow
models, the worker, the Pump, and every error of the Errors table in docs/troubleshooting.md.

The asyncio side (:class:`AsyncQueue`, :class:`AsyncWorker`) is imported on first use
(:func:`__getattr__`): a synchronous user - an Airflow task, a Dagster step, a script - pays
for the modules it runs, not for the asyncio worker's. ``from echomq_core import AsyncWorker``
and ``import *`` resolve them as before; type checkers see them through the
``TYPE_CHECKING`` imports.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .checks import check_int, check_seconds
from .client.clients import AsyncEchoMQ, EchoMQ
from .client.queue import JobSpec, Queue
from .control.options import PumpOptions
from .control.options import describe as describe_option
from .control.rates import RateLimit
from .errors import (
    ConfigurationError,
    ConnectionLost,
    EchoMQError,
    FlowCancelled,
    FlowConflict,
    FlowTimeout,
    InvalidArgument,
    InvalidFlow,
    InvalidInput,
    InvalidJobId,
    InvalidPayload,
    InvalidQueueName,
    JobNotFound,
    LeaseLost,
    ParentFailed,
    PartlyWritten,
    QueueInUse,
    ServerError,
    ServerFull,
    ServerStartError,
    Unrecoverable,
)
from .flows.children import MAX_RANGE
from .flows.frames import library as frame_library
from .flows.frames import results_frame
from .flows.release_watch import MAX_TAKE, check_watcher
from .flows.released import ReleasedRead
from .flows.streaming import MAX_PAGE as MAX_FOLLOW_PAGE
from .flows.waiting import (
    CANCELLED,
    CLOSED,
    FAILED,
    FAST_POLL,
    MISSING,
    RELEASED,
    STALLED,
    TIMED_OUT,
    WAITING,
    FlowWait,
    Verdict,
    kind_of,
)
from .models import (
    Backoff,
    Child,
    ChildFailure,
    FlowCap,
    FlowRef,
    FlowSnapshot,
    FlowSummary,
    Job,
    JobInfo,
    JsonSerializer,
)
from .pump.pump import Pump
from .queues.ops import gc_paused
from .seeing.urls import flow_page
from .wire.collector import paused as collector_paused
from .wire.keyspace import MAX_ID_LENGTH, check_job_id, check_queue, derived_index, id_part
from .work.worker import Worker

if TYPE_CHECKING:
    from .client.async_queue import AsyncQueue as AsyncQueue
    from .work.async_worker import AsyncWorker as AsyncWorker

#: The names imported on first access, and the module of each.
_LAZY = {"AsyncQueue": ".client.async_queue", "AsyncWorker": ".work.async_worker"}

__all__ = [  # noqa: RUF022 - in sorted() order, which tests/test_imports.py checks
    "AsyncEchoMQ",
    "AsyncQueue",
    "AsyncWorker",
    "Backoff",
    "CANCELLED",
    "CLOSED",
    "Child",
    "ChildFailure",
    "ConfigurationError",
    "ConnectionLost",
    "EchoMQ",
    "EchoMQError",
    "FAILED",
    "FAST_POLL",
    "FlowCancelled",
    "FlowCap",
    "FlowConflict",
    "FlowRef",
    "FlowSnapshot",
    "FlowSummary",
    "FlowTimeout",
    "FlowWait",
    "InvalidArgument",
    "InvalidFlow",
    "InvalidInput",
    "InvalidJobId",
    "InvalidPayload",
    "InvalidQueueName",
    "Job",
    "JobInfo",
    "JobNotFound",
    "JobSpec",
    "JsonSerializer",
    "LeaseLost",
    "MAX_FOLLOW_PAGE",
    "MAX_ID_LENGTH",
    "MAX_RANGE",
    "MAX_TAKE",
    "MISSING",
    "ParentFailed",
    "PartlyWritten",
    "Pump",
    "PumpOptions",
    "Queue",
    "QueueInUse",
    "RELEASED",
    "RateLimit",
    "ReleasedRead",
    "STALLED",
    "ServerError",
    "ServerFull",
    "ServerStartError",
    "TIMED_OUT",
    "Unrecoverable",
    "Verdict",
    "WAITING",
    "Worker",
    "check_int",
    "check_job_id",
    "check_queue",
    "check_seconds",
    "check_watcher",
    "collector_paused",
    "derived_index",
    "describe_option",
    "flow_page",
    "frame_library",
    "gc_paused",
    "id_part",
    "kind_of",
    "results_frame",
]

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    """Import a lazy name's module once; the name is then a plain module global, so this
    runs at most once per name."""
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name], __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
