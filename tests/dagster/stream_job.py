"""A job for the streaming re-execution test, importable by path (``reconstructable`` needs
that): ``sfan`` adds a cross-queue flow of 5 children with ``stream=True``; ``sfollow``, its
``FlowFollow`` input, records each value it gets and - in a first run only - fails after 2.

Settings from the environment: ``ECHOMQ_SJOB_URL``, ``ECHOMQ_SJOB_PREFIX``, ``ECHOMQ_SJOB_DIR``
(the gates and the record). Children 0-3 wait for ``<dir>/go`` (touched when ``sfollow``'s body
starts), child 4 for ``<dir>/first`` (touched after a first value in a re-execution only): when
the first run fails, the flow is still held."""

# No ``from __future__ import annotations``: Dagster reads the asset functions' annotations.
import json
import os
from pathlib import Path

from dagster import (
    AssetExecutionContext,
    Definitions,
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
    (_dir() / "go").touch()
    seen: list[str] = []
    for child_id, _value in sfan:
        seen.append(child_id)
        with open(_dir() / "record.jsonl", "a") as out:
            out.write(json.dumps({"run": context.run_id, "child": child_id}) + "\n")
        if not reexecuted and len(seen) == 2:
            raise RuntimeError("the step's process was lost after 2 results")
        if reexecuted:
            (_dir() / "first").touch()
    return seen


def make_job() -> JobDefinition:
    echomq = EchoMQResource(
        url=os.environ["ECHOMQ_SJOB_URL"], prefix=os.environ["ECHOMQ_SJOB_PREFIX"]
    )
    defs = Definitions(
        assets=[sfan, sfollow],
        jobs=[define_asset_job("stream_job", executor_def=in_process_executor)],
        resources={"echomq": echomq, "echomq_io": EchoMQIOManager.from_resource(echomq)},
    )
    return defs.resolve_job_def("stream_job")
