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

from typing import TYPE_CHECKING

from .client.async_client import AsyncEchoMQ
from .client.clients import EchoMQ
from .client.specs import JobSpec
from .client.sync_queue import Queue
from .control.groups import GroupLoad
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
from .flows.released import ReleasedRead
from .flows.waiting import FlowWait, Verdict
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
from .wire.lazy import lazy_names
from .work.worker import Worker

if TYPE_CHECKING:
    from .client.async_queue import AsyncQueue as AsyncQueue
    from .work.async_worker import AsyncWorker as AsyncWorker

#: The names imported on first access, and the module of each.
_LAZY = {"AsyncQueue": ".client.async_queue", "AsyncWorker": ".work.async_worker"}

__all__ = [
    "AsyncEchoMQ",
    "AsyncQueue",
    "AsyncWorker",
    "Backoff",
    "Child",
    "ChildFailure",
    "ConfigurationError",
    "ConnectionLost",
    "EchoMQ",
    "EchoMQError",
    "FlowCancelled",
    "FlowCap",
    "FlowConflict",
    "FlowRef",
    "FlowSnapshot",
    "FlowSummary",
    "FlowTimeout",
    "FlowWait",
    "GroupLoad",
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
    "ParentFailed",
    "PartlyWritten",
    "Pump",
    "Queue",
    "QueueInUse",
    "RateLimit",
    "ReleasedRead",
    "ServerError",
    "ServerFull",
    "ServerStartError",
    "Unrecoverable",
    "Verdict",
    "Worker",
]

__version__ = "0.1.0"


__getattr__, __dir__ = lazy_names(__name__, _LAZY)
