"""What differs between the Airflow versions this provider supports (3.1 to 3.3): one place.

* ``conf`` and the task exceptions moved into the Task SDK (``airflow.sdk``) in 3.2; 3.1 has
  them in ``airflow.configuration`` and ``airflow.exceptions``.
* ``determine_kwargs`` (what a TaskFlow callable takes from the context) is in the Task SDK
  from 3.2; 3.1 has it in ``airflow.utils.operator_helpers``.
* :func:`listeners_registered`: the listener manager is the Task SDK's from 3.2
  (``airflow.sdk.listener``), ``airflow.listeners.listener`` on 3.1.
* ``Connection.aextra_dejson`` (the async read of the extras) exists from 3.2.
* The connection form: 3.2 reads it from provider info (``conn-fields``,
  ``ui-field-behaviour``) and deprecates the hook methods; 3.1 knows only the hook methods
  ``get_connection_form_widgets`` / ``get_ui_field_behaviour``. :data:`FORM_FROM_HOOK` says which
  this Airflow needs; :func:`form_widgets` and :func:`field_behaviour` build the 3.1 answer
  from the one declaration in :mod:`echomq_provider.get_provider_info`.
* :func:`task_state` / :func:`atask_state`: the current state of a task instance, asked of the
  API server through the Task SDK's supervisor channel (``GetTaskStates``, in every 3.x). The
  sensor and its trigger ask it when they are stopped, to tell "marked failed" (cancel the
  flow) from "cleared" or "marked successful" (leave it). In a task process the channel is
  sync; in the triggerer, 3.3 offers ``asend`` on it, while 3.1 and 3.2 have only the sync
  ``send``, which then runs in a thread (a sync send on the triggerer's event loop would wait
  for a reply the same loop has to read). Either returns None when the state cannot be read.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from airflow import __version__ as AIRFLOW_VERSION
from airflow.sdk import Asset  # what outlets name (3.0+)
from packaging.version import Version

AIRFLOW_3_2 = Version(Version(AIRFLOW_VERSION).base_version) >= Version("3.2")

if AIRFLOW_3_2:
    from airflow.sdk import conf
    from airflow.sdk.exceptions import (
        AirflowFailException,
        AirflowNotFoundException,
        AirflowSensorTimeout,
        AirflowSkipException,
    )
else:  # Airflow 3.1
    # the ignores are for the newest Airflow's types; at the floor they are unused
    from airflow.configuration import conf  # type: ignore[assignment,unused-ignore]
    from airflow.exceptions import (  # type: ignore[no-redef,attr-defined,unused-ignore]
        AirflowFailException,
        AirflowNotFoundException,
        AirflowSensorTimeout,
        AirflowSkipException,
    )

try:  # the Task SDK's own not-found error, which Airflow 3.1 may keep apart from the above
    from airflow.sdk.exceptions import AirflowNotFoundException as _SdkNotFound
except ImportError:  # pragma: no cover - an Airflow without it
    _SdkNotFound = AirflowNotFoundException  # type: ignore[misc,unused-ignore]
#: What looking up a connection that is not defined raises, on every supported Airflow.
CONNECTION_NOT_FOUND: tuple[type[Exception], ...] = tuple({AirflowNotFoundException, _SdkNotFound})

try:  # the keyword arguments a TaskFlow callable takes from the context (3.2+: the Task SDK)
    from airflow.sdk.bases.decorator import determine_kwargs
except ImportError:  # Airflow 3.1
    from airflow.utils.operator_helpers import (  # type: ignore[attr-defined,unused-ignore]
        determine_kwargs,
    )

#: Whether this Airflow takes the connection form from the hook's methods (3.1) rather than
#: from provider info (3.2+).
FORM_FROM_HOOK = not AIRFLOW_3_2

__all__ = [
    "AIRFLOW_3_2",
    "CONNECTION_NOT_FOUND",
    "FORM_FROM_HOOK",
    "AirflowFailException",
    "AirflowNotFoundException",
    "AirflowSensorTimeout",
    "AirflowSkipException",
    "Asset",
    "aextra_dejson",
    "aset_xcom",
    "atask_state",
    "conf",
    "determine_kwargs",
    "field_behaviour",
    "form_widgets",
    "listeners_registered",
    "task_state",
]

log = logging.getLogger(__name__)


def listeners_registered() -> bool:
    """Whether plugins registered task-instance listeners in this process (OpenLineage does).
    A task the triggerer ends runs no listener hook, so Airflow refuses ``end_from_trigger``
    with listeners; not knowing counts as yes."""
    try:
        try:
            from airflow.sdk.listener import get_listener_manager
        except ImportError:  # Airflow 3.1
            from airflow.listeners.listener import (  # type: ignore[assignment,unused-ignore]
                get_listener_manager,
            )
        return bool(get_listener_manager().has_listeners)
    except Exception:
        log.debug("could not read the listener manager", exc_info=True)
        return True


async def aextra_dejson(conn: Any) -> dict[str, Any]:
    """The connection's extras, read without blocking the event loop. On 3.1 the extras are
    parsed as they are (this connection type keeps no secret in them)."""
    if hasattr(conn, "aextra_dejson"):
        return dict(await conn.aextra_dejson())
    return dict(json.loads(conn.extra)) if conn.extra else {}


def _connection_type() -> dict[str, Any]:
    from .get_provider_info import get_provider_info

    return dict(get_provider_info()["connection-types"][0])


def field_behaviour() -> dict[str, Any]:
    """``ui-field-behaviour`` in the hook method's shape (``hidden_fields``, ...)."""
    declared = _connection_type()["ui-field-behaviour"]
    return {key.replace("-", "_"): value for key, value in declared.items()}


def form_widgets() -> dict[str, Any]:
    """``conn-fields`` as the wtforms fields Airflow 3.1's hook method returns. Airflow imports
    this only where its form libraries are installed (an ImportError is its documented signal
    that they are not)."""
    from flask_appbuilder.fieldwidgets import BS3TextFieldWidget
    from flask_babel import lazy_gettext
    from wtforms import BooleanField, StringField

    widgets: dict[str, Any] = {}
    for name, spec in _connection_type()["conn-fields"].items():
        kinds = spec["schema"]["type"]
        label = lazy_gettext(spec["label"])
        description = spec.get("description", "")
        if "boolean" in kinds:
            widgets[name] = BooleanField(label, description=description)
        else:
            widgets[name] = StringField(
                label,
                widget=BS3TextFieldWidget(),
                description=description,
                default=spec["schema"].get("default"),
            )
    return widgets


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


async def aset_xcom(ti: Any, key: str, value: Any) -> None:
    """Store a task's XCom from the triggerer's event loop, serialised as the task itself
    would (the XCom backend's ``serialize_value``, then ``SetXCom`` to the supervisor). Not
    ``TaskSuccessEvent(xcoms=...)``: on 3.3 that path stores the value JSON-encoded once
    more, and the downstream task reads a string. Raises when the channel refuses."""
    from airflow.sdk.execution_time import task_runner
    from airflow.sdk.execution_time.comms import SetXCom
    from airflow.sdk.execution_time.xcom import XCom

    map_index = -1 if ti.map_index is None else ti.map_index
    ident = {"dag_id": ti.dag_id, "run_id": ti.run_id, "task_id": ti.task_id}
    stored = XCom.serialize_value(value=value, key=key, map_index=map_index, **ident)
    request = SetXCom(key=key, value=stored, map_index=map_index, **ident)
    comms = task_runner.SUPERVISOR_COMMS
    if hasattr(comms, "asend"):
        await comms.asend(request)
    else:  # Airflow 3.1 / 3.2: the sync channel, off the event loop
        await asyncio.to_thread(comms.send, request)


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


def clear_number(context: Any) -> int | None:
    """How many times the task's DAG run has been cleared (``dag_run.clear_number``, Airflow
    3.0+), from a task's context or a callback's (the dag processor's context carries the run
    as it was when the scheduler failed the task): the attempt a flow's epoch records
    (:meth:`echomq_core.EchoMQ.note_epoch`). None when the context does not say."""
    try:
        run = context.get("dag_run")
    except Exception:  # a context without mapping access
        return None
    number = getattr(run, "clear_number", None)
    if isinstance(number, int) and not isinstance(number, bool) and number >= 0:
        return number
    return None
