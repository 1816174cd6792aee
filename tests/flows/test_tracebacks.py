"""A failed attempt keeps its traceback: on the row, in ``get_job``, in ``child_failures``, and in
the worker's log (one WARNING per attempt, the traceback with INFO on)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from echomq_core import AsyncEchoMQ, AsyncWorker, Backoff, Child, EchoMQ, Job, Pump, Worker
from echomq_core.models import MAX_TRACEBACK

from ..conftest import Backend
from ..waiting import eventually


def failed(mq: EchoMQ, ref: Any) -> bool:
    return mq.snapshot(ref.queue, ref.parent_id).parent_state == "failed"


def parse_row(payload: dict[str, Any]) -> int:
    return _inner_parse(payload["row"])


def _inner_parse(text: str) -> int:
    return int(text)  # ValueError for the bad row, raised two frames down


def test_traceback_kept_and_read_through_child_failures(mq: EchoMQ) -> None:
    parent_id = "JOB-af/dag/fan_out/3f9a"  # the shape of an Airflow-derived id
    rows = [{"row": str(i)} for i in range(20)]
    rows[7] = {"row": "seven"}
    children = [Child(r, queue="tb-work") for r in rows]
    children[3] = Child({"row": "three"}, queue="tb-work", ignore_dependency_on_failure=True)
    ref = mq.add_flow("tb-parents", children, parent_id=parent_id, barrier=True, max_attempts=2)
    worker = Worker(mq, {"tb-work": lambda job: parse_row(job.payload)}, concurrency=2).start()
    pump = Pump(mq).start()
    try:
        eventually(lambda: failed(mq, ref), what="the parent failed")
        eventually(lambda: len(mq.child_failures(ref.queue, ref.parent_id)) == 2, what="2 deaths")
    finally:
        worker.stop()
        pump.stop()
    failures = mq.child_failures(ref.queue, ref.parent_id)
    first, ignored = failures
    assert (first.queue, first.job_id, first.ignored) == ("tb-work", f"{parent_id}.7", False)
    assert first.error == "ValueError: invalid literal for int() with base 10: 'seven'"
    assert first.traceback is not None
    assert first.traceback.startswith("Traceback (most recent call last):")
    assert "in _inner_parse" in first.traceback and "in parse_row" in first.traceback
    assert first.traceback.rstrip().endswith(first.error)
    assert (ignored.job_id, ignored.ignored) == (f"{parent_id}.3", True)
    assert "'three'" in (ignored.traceback or "")
    info = mq.get_job("tb-work", f"{parent_id}.7")
    assert (info.state, info.attempts, info.traceback) == ("dead", 2, first.traceback)
    assert mq.child_failures(ref.queue, ref.parent_id, limit=1) == [first]


def test_a_failed_sub_flow_stands_for_its_leaf(mq: EchoMQ) -> None:
    inner = Child(None, queue="tb-mid", children=[Child({"row": "x"}, queue="tb-leaf")])
    ref = mq.add_flow("tb-top", [Child({"row": "1"}, queue="tb-leaf"), inner], max_attempts=1)
    worker = Worker(mq, {"tb-leaf": lambda job: parse_row(job.payload)}, concurrency=1).start()
    pump = Pump(mq).start()
    try:
        eventually(lambda: failed(mq, ref), what="the parent failed")
    finally:
        worker.stop()
        pump.stop()
    (leaf,) = mq.child_failures(ref.queue, ref.parent_id)
    assert (leaf.queue, leaf.job_id) == ("tb-leaf", f"{ref.parent_id}.1.0")
    assert "in _inner_parse" in (leaf.traceback or "")


def test_traceback_is_cut_to_its_tail(mq: EchoMQ) -> None:
    q = mq.queue("tb-long", max_attempts=1)
    job_id = q.add("x")

    def deep(n: int) -> None:
        if n == 0:
            raise RuntimeError("bottom " + "y" * 30_000)
        deep(n - 1)

    worker = Worker(mq, {"tb-long": lambda job: deep(200)}, concurrency=1).start()
    try:
        eventually(lambda: q.stats()["dead"] == 1, what="dead")
    finally:
        worker.stop()
    trace = q.get_job(job_id).traceback or ""
    assert len(trace.encode()) <= MAX_TRACEBACK
    assert trace.startswith("[... ") and "bytes of the traceback cut" in trace
    assert trace.rstrip().endswith("y" * 100)  # the tail: the exception line survives


def test_failed_attempts_are_logged(mq: EchoMQ, caplog: pytest.LogCaptureFixture) -> None:
    q = mq.queue("tb-log", max_attempts=2)
    job_id = q.add({"row": "bad"})
    caplog.set_level(logging.WARNING, logger="echomq_core.worker")
    worker = Worker(
        mq,
        {"tb-log": lambda job: parse_row(job.payload)},
        concurrency=1,
        queue_options={"backoff": Backoff(10, 20)},
    ).start()
    try:
        eventually(lambda: q.stats()["dead"] == 1, timeout=60, what="dead")
    finally:
        worker.stop()
    lines = [r.getMessage() for r in caplog.records if "failed, attempt" in r.getMessage()]
    assert lines == [
        f"job {job_id} in 'tb-log' failed, attempt 1 of 2 (will retry): ValueError: invalid "
        "literal for int() with base 10: 'bad'",
        f"job {job_id} in 'tb-log' failed, attempt 2 of 2 (dead): ValueError: invalid "
        "literal for int() with base 10: 'bad'",
    ]


def test_failed_attempt_logs_traceback_at_info(
    mq: EchoMQ, caplog: pytest.LogCaptureFixture
) -> None:
    q = mq.queue("tb-info", max_attempts=1)
    q.add({"row": "bad"})
    caplog.set_level(logging.INFO, logger="echomq_core.worker")
    worker = Worker(mq, {"tb-info": lambda job: parse_row(job.payload)}, concurrency=1).start()
    try:
        eventually(lambda: q.stats()["dead"] == 1, what="dead")
    finally:
        worker.stop()
    (line,) = [r.getMessage() for r in caplog.records if "failed, attempt" in r.getMessage()]
    assert "\nTraceback (most recent call last):" in line and "in _inner_parse" in line


def test_revive_and_repair_drop_the_traceback(mq: EchoMQ) -> None:
    q = mq.queue("tb-revive", max_attempts=1)
    job_id = q.add("x")
    (job,) = q.claim()
    q.fail(job, "RuntimeError: once", retry=False, traceback="Traceback ...\nRuntimeError: once")
    assert q.get_job(job_id).traceback == "Traceback ...\nRuntimeError: once"
    q.retry_dead([job_id])
    info = q.get_job(job_id)
    assert (info.state, info.error, info.traceback) == ("pending", None, None)
    (job,) = q.claim()
    q.fail(job, "RuntimeError: no trace", retry=False)
    assert q.get_job(job_id).traceback is None


def test_async_worker_keeps_traceback(backend: Backend, prefix: str) -> None:
    async def scenario() -> list[Any]:
        client = AsyncEchoMQ(backend.url, cluster=backend.cluster, prefix=prefix)
        sync = backend.client(prefix)
        try:
            ref = sync.add_flow(
                "tb-aparent",
                [Child({"row": "a"}, queue="tb-awork"), Child({"row": "2"}, queue="tb-awork")],
                max_attempts=1,
                barrier=True,
            )

            async def handle(job: Job) -> int:
                return parse_row(job.payload)

            worker = AsyncWorker(client, {"tb-awork": handle}, concurrency=2)
            task = asyncio.create_task(worker.run(install_signals=False))
            pump = Pump(sync).start()
            try:
                for _ in range(1500):
                    if (await client.snapshot(ref.queue, ref.parent_id)).parent_state == "failed":
                        break
                    await asyncio.sleep(0.02)
                return await client.child_failures(ref.queue, ref.parent_id)
            finally:
                await worker.stop()
                await task
                pump.stop()
        finally:
            await client.close()
            sync.close()

    (failure,) = asyncio.run(scenario())
    assert failure.job_id.endswith(".0") and failure.queue == "tb-awork"
    assert "in _inner_parse" in (failure.traceback or "")


def test_a_traceback_shown_in_a_failure_message_is_its_tail_in_whole_lines() -> None:
    """The one rule the Airflow provider and the Dagster integration show a traceback by: the
    end (where the exception is), whole lines, at most SHOWN_TRACEBACK characters, with a line
    that says how much was cut; a short one as it is."""
    from echomq_core.integration import SHOWN_TRACEBACK, traceback_tail

    frames = "".join(f'  File "job.py", line {n}, in step_{n}\n    go({n})\n' for n in range(400))
    text = "Traceback (most recent call last):\n" + frames + "ValueError: the last line\n"
    shown = traceback_tail(text)
    head, body = shown.split("\n", 1)
    assert len(body) <= SHOWN_TRACEBACK and body.endswith("ValueError: the last line")
    assert body.startswith("  ") and ("\n" + body) in text  # it starts at a line start
    assert head == f"[... {len(text.rstrip(chr(10))) - len(body)} characters cut]"
    assert traceback_tail("ValueError: short\n") == "ValueError: short"
    cut = traceback_tail("x" * 50 + "\n" + "y" * 30, limit=40)
    assert cut == "[... 51 characters cut]\n" + "y" * 30
