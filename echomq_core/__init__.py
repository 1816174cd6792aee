"""EchoMQ: durable fan-out / fan-in for data pipelines on Redis-protocol servers.

What this package exports (``__all__``) is the public API: the clients, the queue and flow
models, the worker, the Pump, and every error of the README's Errors table.
"""

from .async_queue import AsyncQueue
from .async_worker import AsyncWorker
from .client import AsyncEchoMQ, EchoMQ
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
    ServerError,
    ServerFull,
    ServerStartError,
    Unrecoverable,
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
from .pump import Pump
from .queue import JobSpec, Queue
from .rates import RateLimit
from .waiting import FlowWait, Verdict
from .worker import Worker

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
    "Pump",
    "Queue",
    "RateLimit",
    "ServerError",
    "ServerFull",
    "ServerStartError",
    "Unrecoverable",
    "Verdict",
    "Worker",
]

__version__ = "0.1.0"
