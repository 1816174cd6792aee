"""What differs between Airflow 3.1 and 3.3, in one place.

The exceptions a task raises to fail, skip or time out (``AirflowFailException``,
``AirflowSkipException``, ``AirflowSensorTimeout``) live in ``airflow.sdk.exceptions`` from
3.2 on (``airflow.exceptions`` then re-exports them with a deprecation warning); 3.1 has them
only in ``airflow.exceptions``. Import them from here.

:func:`aextra`: a connection's extras, parsed without blocking the event loop: 3.2+ has
``Connection.aextra_dejson()``; 3.1 only the sync ``extra_dejson``, whose masking call would
block a triggerer, so there the JSON is parsed here (Airflow already masked the connection's
secrets when it fetched it).

:data:`CONN_FORM_IN_PROVIDER_INFO`: Airflow 3.2+ builds the connection form from
``conn-fields`` / ``ui-field-behaviour`` in the provider info (and deprecates the hook
methods); 3.1 asks the hook class (see :mod:`echomq_provider.hooks.echomq`).

:func:`default_deferrable`: ``[operators] default_deferrable``. Airflow 3.2 exports the
configuration as ``airflow.sdk.conf``; 3.1 has only ``airflow.configuration.conf``.

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
import json
import logging
from importlib.metadata import version
from typing import Any

try:
    from airflow.sdk.exceptions import (
        AirflowFailException,
        AirflowSensorTimeout,
        AirflowSkipException,
    )
except ImportError:  # Airflow 3.1
    from airflow.exceptions import (  # type: ignore[assignment,no-redef]
        AirflowFailException,
        AirflowSensorTimeout,
        AirflowSkipException,
    )

CONN_FORM_IN_PROVIDER_INFO = tuple(int(p) for p in version("apache-airflow").split(".")[:2]) >= (
    3,
    2,
)

__all__ = [
    "CONN_FORM_IN_PROVIDER_INFO",
    "AirflowFailException",
    "AirflowSensorTimeout",
    "AirflowSkipException",
    "aextra",
    "atask_state",
    "default_deferrable",
    "task_state",
]

log = logging.getLogger(__name__)


async def aextra(conn: Any) -> dict[str, Any]:
    """The connection's extras as a dict, without a blocking call (see the module doc)."""
    if hasattr(conn, "aextra_dejson"):
        return dict(await conn.aextra_dejson())
    if not conn.extra:
        return {}
    parsed = json.loads(conn.extra)
    return dict(parsed) if isinstance(parsed, dict) else {"": parsed}


def default_deferrable() -> bool:
    """``[operators] default_deferrable`` (False when unset)."""
    try:
        from airflow.sdk import conf
    except ImportError:  # Airflow 3.1
        from airflow.configuration import conf  # type: ignore[assignment]
    return bool(conf.getboolean("operators", "default_deferrable", fallback=False))


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
