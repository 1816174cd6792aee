"""Records every lifecycle event as one JSON line in ``$ECHOMQ_TEST_PLUGIN_LOG`` and serves
the queues ``plug-work`` and ``plug-parents`` (through ``echomq_handlers``).

A job whose payload has ``"fail": true`` raises :class:`Unrecoverable` (it dies at once); a
parent returns the number of its children's results.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

from echomq_core import Job, Unrecoverable
from echomq_core.hooks import hookimpl

_lock = threading.Lock()


def _record(event: str, **fields: Any) -> None:
    path = os.environ.get("ECHOMQ_TEST_PLUGIN_LOG")
    if not path:
        return
    line = json.dumps({"event": event, "pid": os.getpid(), **fields}) + "\n"
    with _lock:
        # O_APPEND + one write per line: lines of the worker and the Pump never interleave.
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)


@hookimpl
def echomq_job_completed(job: Job, result: Any) -> None:
    _record("job_completed", queue=job.queue, id=job.id, result=result)


@hookimpl
def echomq_job_dead(job: Job, error: str) -> None:
    _record("job_dead", queue=job.queue, id=job.id, error=error)


@hookimpl
def echomq_flow_released(queue: str, parent_id: str, client: Any) -> None:
    # a plugin may read the flow through the client it is handed
    _record(
        "flow_released",
        queue=queue,
        id=parent_id,
        outstanding=client.dependencies(queue, parent_id) if client else None,
    )


@hookimpl
def echomq_flow_failed(queue: str, parent_id: str) -> None:
    _record("flow_failed", queue=queue, id=parent_id)


@hookimpl
def echomq_signal_poisoned(queue: str, reason: str) -> None:
    _record("signal_poisoned", queue=queue, reason=reason)


def work(job: Job) -> Any:
    if isinstance(job.payload, dict) and job.payload.get("fail"):
        raise Unrecoverable("told to fail")
    return {"double": 2 * int(job.payload["n"])} if isinstance(job.payload, dict) else None


@hookimpl
def echomq_handlers(client: Any) -> dict[str, Any]:
    def parent(job: Job) -> Any:
        return len(client.children_values(job.queue, job.id))

    return {"plug-work": work, "plug-parents": parent}
