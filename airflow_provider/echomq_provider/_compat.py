"""Reads of Airflow state that differ between Airflow 3.1 and 3.3, in one place.

:func:`task_state` / :func:`atask_state`: the current state of a task instance, asked of the
API server through the Task SDK's supervisor channel (``GetTaskStates``, in every 3.x). The
sensor and its trigger ask it when they are stopped, to tell "marked failed" (cancel the flow)
from "cleared" or "marked successful" (leave it). In a task process the channel is sync; in
the triggerer, 3.3 offers ``asend`` on it, while 3.1 and 3.2 have only the sync ``send``,
which must then run in a thread (a sync send on the triggerer's event loop would wait for a
reply that the same loop has to read). Either returns None when the state cannot be read
(outside a task or trigger, an older channel, a server that does not answer).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

log = logging.getLogger(__name__)


def _request(dag_id: str, run_id: str, task_id: str, map_index: int | None) -> Any:
    from airflow.sdk.execution_time.comms import GetTaskStates

    return GetTaskStates(
        dag_id=dag_id,
        task_ids=[task_id],
        run_ids=[run_id],
        map_index=None if map_index is None or map_index < 0 else map_index,
    )


def _state_of(reply: Any, run_id: str, task_id: str, map_index: int | None) -> str | None:
    states = getattr(reply, "task_states", None) or {}
    name = task_id if map_index is None or map_index < 0 else f"{task_id}_{map_index}"
    state = states.get(run_id, {}).get(name)
    return "none" if state is None and name in states.get(run_id, {}) else state and str(state)


def task_state(dag_id: str, run_id: str, task_id: str, map_index: int | None) -> str | None:
    """The task instance's state as the API server has it (task processes)."""
    try:
        from airflow.sdk.execution_time import task_runner

        reply = task_runner.SUPERVISOR_COMMS.send(_request(dag_id, run_id, task_id, map_index))
        return _state_of(reply, run_id, task_id, map_index)
    except Exception as exc:  # a state we cannot read is reported as unknown
        log.debug("task state unreadable: %s: %s", type(exc).__name__, exc)
        return None


async def atask_state(dag_id: str, run_id: str, task_id: str, map_index: int | None) -> str | None:
    """The task instance's state as the API server has it (the triggerer's event loop)."""
    try:
        from airflow.sdk.execution_time import task_runner

        comms = task_runner.SUPERVISOR_COMMS
        request = _request(dag_id, run_id, task_id, map_index)
        if hasattr(comms, "asend"):
            reply = await comms.asend(request)
        else:  # Airflow 3.1 / 3.2: the sync channel, off the event loop
            reply = await asyncio.to_thread(comms.send, request)
        return _state_of(reply, run_id, task_id, map_index)
    except Exception as exc:
        log.debug("task state unreadable: %s: %s", type(exc).__name__, exc)
        return None
