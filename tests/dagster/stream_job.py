"""Definitions for the streaming tests, importable by path (``reconstructable`` needs that, and
``dagster dev -f`` loads ``defs``): ``sfan`` adds a cross-queue flow of 5 children with
``stream=True``; ``sfollow``, its ``FlowFollow`` input, records each value it gets and - with
``ECHOMQ_SJOB_FAIL_AFTER=k``, in a first run only - fails after ``k`` (records: JSON lines
``{"run", "child", "at"}`` in ``<dir>/record.jsonl``).

Settings from the environment: ``ECHOMQ_SJOB_URL``, ``ECHOMQ_SJOB_PREFIX``, ``ECHOMQ_SJOB_DIR``
(the gates and the record). Children 0-3 wait for ``<dir>/go`` (touched when ``sfollow``'s body
starts), child 4 for ``<dir>/first`` (touched after a first value, unless the run is to fail):
when a first run fails, the flow is still held."""

# No ``from __future__ import annotations``: Dagster reads the asset functions' annotations.
import json
import os
import time
from pathlib import Path
from typing import Any

from dagster import (
    AssetExecutionContext,
    Definitions,
    EnvVar,
    JobDefinition,
    asset,
    define_asset_job,
    in_process_executor,
)
from dagster_echomq import EchoMQIOManager, EchoMQResource, FlowFollow

from echomq_core import Child, FlowRef

PARENT, CHILD, N = "sx-parent", "sx-child", 5


def _dir() -> Path:
    return Path(os.environ["ECHOMQ_SJOB_DIR"])


@asset(io_manager_key="echomq_io")
def sfan(context: AssetExecutionContext, echomq: EchoMQResource) -> FlowRef:
    gates = [str(_dir() / ("first" if i == N - 1 else "go")) for i in range(N)]
    children = [Child({"n": i, "wait_for": gates[i]}, queue=CHILD) for i in range(N)]
    return echomq.add_flow(PARENT, children, parent_id=echomq.run_scoped_id(context), stream=True)


@asset
def sfollow(context: AssetExecutionContext, sfan: FlowFollow) -> list[str]:
    reexecuted = context.run.parent_run_id is not None  # (its root_run_id: the first run)
    fail_after = 0 if reexecuted else int(os.environ.get("ECHOMQ_SJOB_FAIL_AFTER", "0"))
    (_dir() / "go").touch()
    seen: list[str] = []
    for child_id, _value in sfan:
        seen.append(child_id)
        with open(_dir() / "record.jsonl", "a") as out:
            record = {"run": context.run_id, "child": child_id, "at": time.time()}
            out.write(json.dumps(record) + "\n")
        if fail_after:
            if len(seen) == fail_after:  # the last child is still gated: the flow is held
                raise RuntimeError(f"the step's process was lost after {fail_after} results")
            continue
        (_dir() / "first").touch()  # only now may the last child settle
    return seen


def _resources() -> dict[str, Any]:
    echomq = EchoMQResource(url=EnvVar("ECHOMQ_SJOB_URL"), prefix=EnvVar("ECHOMQ_SJOB_PREFIX"))
    return {"echomq": echomq, "echomq_io": EchoMQIOManager.from_resource(echomq)}


def make_job() -> JobDefinition:
    """The job in process (``execute_job``)."""
    job = define_asset_job("stream_job", executor_def=in_process_executor)
    defs = Definitions(assets=[sfan, sfollow], jobs=[job], resources=_resources())
    return defs.resolve_job_def("stream_job")


#: Under ``dagster dev``: the default executor, each step a process of its own.
defs = Definitions(
    assets=[sfan, sfollow], jobs=[define_asset_job("stream_job")], resources=_resources()
)
