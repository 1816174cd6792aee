"""Sharded queues (echomq_core.flows.sharding): one logical queue as K physical queues, each on its
own slot, on distinct masters of the 3-master Cluster; adds spread by id, workers serve all
shards."""

from __future__ import annotations

import asyncio
import json
import threading
from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from redis.crc import key_slot

from echomq_core import (
    AsyncEchoMQ,
    AsyncWorker,
    Child,
    EchoMQ,
    FlowConflict,
    InvalidArgument,
    Job,
    JobSpec,
    QueueInUse,
    Worker,
)
from echomq_core.flows import retention
from echomq_core.flows.sharding import MAX_SHARDS, choose, shard_of
from echomq_core.queues import reads

from ..conftest import Backend
from ..waiting import eventually, eventually_async


def _slot(queue: str) -> int:
    return key_slot(queue.encode())


def _pending(mq: EchoMQ, queue: str) -> int:
    """Pending jobs of one physical queue (a handle on shard 0 counts the whole logical one)."""
    return int(mq.perform(reads.stats(mq.keys, queue))["pending"])


@pytest.mark.onlycluster
def test_three_shards_land_on_three_distinct_masters(backend: Backend, mq: EchoMQ) -> None:
    names = mq.set_shards("fan", 3)
    assert names[0] == "fan" and len(set(names)) == 3
    assert len({backend.node_of_queue(n) for n in names}) == 3
    # stored on the server: a fresh client reads the same names, never recomputes them
    other = backend.client(mq.keys.prefix)
    assert other.shards("fan") == names
    other.close()


@pytest.mark.onlystandalone
def test_standalone_shards_spread_over_the_slot_space(mq: EchoMQ) -> None:
    names = mq.set_shards("fan", 4)
    first = _slot("fan")
    stretch = [((_slot(n) - first) % 16384) // 4096 for n in names]
    assert stretch == [0, 1, 2, 3]


def test_k1_is_todays_queue(backend: Backend, mq: EchoMQ) -> None:
    assert mq.set_shards("plain", 1) == ("plain",)
    assert mq.shards("plain") == ("plain",)
    ids = mq.queue("plain").add_bulk(list(range(30)))
    assert _pending(mq, "plain") == 30
    assert {shard_of(("plain",), i) for i in ids} == {"plain"}
    # no shards field written: the config hash holds no trace of sharding
    (raw,) = mq.connection.execute([_hget(mq, "plain")])
    assert raw is None


def _hget(mq: EchoMQ, queue: str) -> Any:
    from echomq_core.wire.calls import Call

    return Call.cmd("HGET", mq.keys.config(queue), "shards")


def test_refused_while_the_queue_holds_jobs(mq: EchoMQ) -> None:
    mq.queue("busy").add("x")
    with pytest.raises(QueueInUse, match="busy"):
        mq.set_shards("busy", 3)
    assert mq.shards("busy") == ("busy",)
    (raw,) = mq.connection.execute([_hget(mq, "busy")])
    assert raw is None  # nothing half-written


def test_refused_when_a_shard_holds_jobs(mq: EchoMQ) -> None:
    names = mq.set_shards("grown", 3)
    mq.queue("grown").add_bulk(list(range(60)))
    with pytest.raises(QueueInUse, match="from 3 to 2 shards"):
        mq.set_shards("grown", 2)
    assert mq.shards("grown") == names


def test_count_out_of_range_is_refused(mq: EchoMQ) -> None:
    for bad in (0, MAX_SHARDS + 1, -1, 2.0, "3", True):
        with pytest.raises(InvalidArgument, match="shards"):
            mq.set_shards("q", bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="sharded queue's name"):
        mq.set_shards("n" * 120, 2)


def test_a_change_while_empty_takes_new_names(mq: EchoMQ) -> None:
    three = mq.set_shards("empty", 3)
    assert mq.set_shards("empty", 3) == three  # the same count keeps its names
    two = mq.set_shards("empty", 2)
    assert len(two) == 2 and two[0] == "empty"
    assert mq.set_shards("empty", 1) == ("empty",)
    fresh = EchoMQ(connection=mq.connection, prefix=mq.keys.prefix)
    assert fresh.shards("empty") == ("empty",)


def test_bulk_adds_spread_by_id_in_one_step(backend: Backend, mq: EchoMQ) -> None:
    names = mq.set_shards("spread", 3)
    calls: list[int] = []
    execute = mq.connection.execute

    def counting(step: Any) -> Any:
        calls.append(len(step))
        return execute(step)

    mq.connection.execute = counting  # type: ignore[method-assign]
    ids = mq.queue("spread").add_bulk(list(range(3000)))
    mq.connection.execute = execute  # type: ignore[method-assign]
    assert len(calls) == 1, calls  # every shard's part, one pipeline (one round trip per node)
    shares = {n: _pending(mq, n) for n in names}
    assert sum(shares.values()) == 3000
    assert all(800 <= v <= 1200 for v in shares.values()), shares
    assert mq.queue("spread").stats()["pending"] == 3000  # summed under the logical name
    for job_id in ids[:50]:
        assert mq.get_job("spread", job_id).state == "pending"


def test_explicit_ids_dedupe_across_clients(backend: Backend, mq: EchoMQ) -> None:
    mq.set_shards("ids", 3)
    other = backend.client(mq.keys.prefix)
    specs = [JobSpec(i, id=f"JOB-af/dag/task/{i:04d}") for i in range(300)]
    assert mq.queue("ids").add_bulk(specs) == [s.id for s in specs]
    other.queue("ids").add_bulk(specs)  # a retry by id from another process
    other.queue("ids").add("again", job_id="JOB-af/dag/task/0007")
    assert mq.queue("ids").stats()["pending"] == 300
    info = other.get_job("ids", "JOB-af/dag/task/0007")
    assert info.payload == 7
    other.close()


def test_a_plain_claim_serves_every_shard(mq: EchoMQ) -> None:
    mq.set_shards("manual", 3)
    queue = mq.queue("manual")
    ids = queue.add_bulk(list(range(90)))
    seen: list[str] = []
    for _ in range(10):
        jobs = queue.claim(30)
        if not jobs:
            continue
        assert queue.complete_many([(j, j.payload) for j in jobs]) == [True] * len(jobs)
        seen += [j.id for j in jobs]
    assert sorted(seen) == sorted(ids)
    assert queue.stats()["completed"] == 90


@pytest.mark.onlycluster
def test_a_flow_into_three_shards_settles_every_child_once(backend: Backend, mq: EchoMQ) -> None:
    names = mq.set_shards("kids", 3)
    runs: Counter[str] = Counter()
    by_shard: Counter[str] = Counter()
    lock = threading.Lock()

    def child(job: Job) -> Any:
        with lock:
            runs[job.id] += 1
            by_shard[job.shard] += 1
        return job.payload

    n = 3000
    ref = mq.add_flow(
        "top", [Child(i, queue="kids") for i in range(n)], parent_id="JOB-af/dag/fan/abc123",
        barrier=True,
    )  # fmt: skip
    assert {q for q, _ in ref.children} == set(names)
    worker = Worker(mq, {"kids": child}, concurrency=8, max_batch=200)
    worker.start()
    try:
        eventually(
            lambda: mq.snapshot(ref.queue, ref.parent_id).parent_state == "released",
            timeout=90,
            what=lambda: (sum(runs.values()), mq.dependencies(ref.queue, ref.parent_id)),
        )
    finally:
        worker.stop()
    assert len(runs) == n and set(runs.values()) == {1}
    assert set(by_shard) == set(names)
    assert all(800 <= by_shard[q] <= 1200 for q in names), by_shard
    values = mq.children_values(ref.queue, ref.parent_id)
    assert len(values) == n and sorted(values.values()) == list(range(n))


def test_a_parent_in_a_sharded_queue(backend: Backend, mq: EchoMQ) -> None:
    """A root in a sharded queue lands on its id's shard; its children default to the logical
    queue, so they spread too; one worker of the logical name runs them all and the parent."""
    names = mq.set_shards("both", 3)
    ran: list[str] = []

    def handle(job: Job) -> Any:
        ran.append(job.id)
        return 1

    ref = mq.add_flow("both", [Child(i) for i in range(60)], parent_id="JOB-root-1")
    assert ref.queue == shard_of(names, "JOB-root-1")
    worker = Worker(mq, {"both": handle}, concurrency=4)
    worker.start()
    try:
        eventually(lambda: "JOB-root-1" in ran, timeout=60, what=lambda: len(ran))
    finally:
        worker.stop()
    assert sorted(ran) == sorted([*[f"JOB-root-1.{i}" for i in range(60)], "JOB-root-1"])
    assert mq.get_job("both", "JOB-root-1").state == "completed"


@pytest.mark.onlycluster
def test_an_idle_worker_blocks_on_every_shard(backend: Backend, mq: EchoMQ) -> None:
    """On a Cluster the shards are on three slots: an idle worker's fetcher waits on each
    slot's hint (one BZPOPMIN per slot), so an add to any shard is claimed without a poll.
    With ``max_poll`` of 60 s a poll could not pick the job up within the test's wait."""
    names = mq.set_shards("idle", 3)
    got: list[str] = []

    def handle(job: Job) -> Any:
        got.append(job.shard)
        return None

    worker = Worker(mq, {"idle": handle}, poll=30.0, max_poll=60.0)
    worker.start()
    try:
        for k, name in enumerate(names):
            # an id that hashes onto this shard
            tries = (f"JOB-w{k}-{i}" for i in range(10_000))
            job_id = next(i for i in tries if shard_of(names, i) == name)
            mq.queue("idle").add(k, job_id=job_id)
            eventually(lambda k=k: len(got) > k, timeout=10, what=f"job on shard {k}")
    finally:
        worker.stop()
    assert got == list(names)


def test_cli_queue_config_shards(backend: Backend, mq: EchoMQ, capsys: Any) -> None:
    from echomq_core.cli import main

    url = backend.url.replace("redis://", "redis+cluster://") if backend.cluster else backend.url
    conn = ["--url", url, "--prefix", mq.keys.prefix]
    capsys.readouterr()
    assert main(["queue", "config", "cq", "--shards", "3", "--json", *conn]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["changed"] == ["shards"] and doc["shards"] == list(mq.shards("cq"))
    assert len(doc["shards"]) == 3
    assert main(["queue", "config", "cq", *conn]) == 0
    assert f"shards of 'cq': 3 ({', '.join(doc['shards'])})" in capsys.readouterr().out
    mq.queue("cq").add("x")
    assert main(["queue", "config", "cq", "--shards", "2", *conn]) != 0
    err = capsys.readouterr().err
    assert "cannot change from 3 to 2 shards" in err
    assert main(["queue", "config", "cq", "--shards", "65", *conn]) != 0
    assert "shards must be" in capsys.readouterr().err


def test_reads_cancel_and_retry_by_the_logical_name(backend: Backend, mq: EchoMQ) -> None:
    """A flow whose parent and children are both in sharded queues: every read and lifecycle
    call takes the logical names; a cancel stops the children in every shard, a retry puts
    them all back, and a worker of the logical name then settles each once."""
    mq.set_shards("lp", 3)
    kids = mq.set_shards("lk", 3)
    pid = "JOB-af/dag/task/9f3e"
    ref = mq.add_flow("lp", [Child(i, queue="lk") for i in range(90)], parent_id=pid, barrier=True)
    assert mq.snapshot("lp", pid).total == 90
    assert mq.dependencies("lp", pid) == 90
    assert sorted(mq.child_queues("lp", pid)) == sorted(kids)
    cancelled = mq.cancel_flow("lp", pid, reason="stop")
    assert mq.snapshot("lp", pid).parent_state == "cancelled", cancelled
    assert mq.queue("lk").stats()["pending"] == 0
    mq.retry_flow("lp", pid)
    assert mq.snapshot("lp", pid).parent_state == "held"
    assert mq.queue("lk").stats()["pending"] == 90
    runs: Counter[str] = Counter()
    worker = Worker(mq, {"lk": lambda job: runs.update([job.id]) or job.payload}, concurrency=4)
    worker.start()
    try:
        eventually(lambda: mq.snapshot("lp", pid).parent_state == "released", timeout=60,
                   what=lambda: sum(runs.values()))  # fmt: skip
    finally:
        worker.stop()
    assert len(runs) == 90 and set(runs.values()) == {1}
    assert sorted(mq.children_values("lp", pid).values()) == list(range(90))
    assert mq.close_flow("lp", pid) == "closed"
    assert ref.queue == mq.home("lp", pid)


def test_the_async_worker_serves_every_shard(backend: Backend, mq: EchoMQ) -> None:
    names = mq.set_shards("aq", 3)
    ids = mq.queue("aq").add_bulk(list(range(150)))
    runs: Counter[str] = Counter()

    async def handle(job: Job) -> Any:
        runs[job.shard] += 1
        return job.payload

    async def main() -> set[str]:
        amq = AsyncEchoMQ(backend.url, cluster=backend.cluster, prefix=mq.keys.prefix)
        worker = AsyncWorker(amq, {"aq": handle}, concurrency=4)
        try:
            await worker.start()
            served = set(worker.handlers)
            await eventually_async(lambda: sum(runs.values()) >= len(ids), timeout=30)
            return served
        finally:
            await worker.stop()
            await amq.close()

    assert asyncio.run(main()) == set(names)
    assert sum(runs.values()) == 150 and set(runs) == set(names)
    assert mq.queue("aq").stats()["completed"] == 150


@pytest.mark.onlycluster
def test_an_idle_async_worker_blocks_on_every_shard(backend: Backend, mq: EchoMQ) -> None:
    """As the threaded worker: one blocked wait per shard's slot, so an add to any shard is
    claimed at once although ``max_poll`` is 60 s."""
    names = mq.set_shards("aidle", 3)
    got: list[str] = []

    async def handle(job: Job) -> Any:
        got.append(job.shard)

    async def main() -> None:
        amq = AsyncEchoMQ(backend.url, cluster=True, prefix=mq.keys.prefix)
        worker = AsyncWorker(amq, {"aidle": handle}, poll=30.0, max_poll=60.0)
        try:
            await worker.start()
            for k, name in enumerate(names):
                tries = (f"JOB-a{k}-{i}" for i in range(10_000))
                job_id = next(i for i in tries if shard_of(names, i) == name)
                await amq.queue("aidle").add(k, job_id=job_id)
                await eventually_async(lambda k=k: len(got) > k, timeout=10, what=f"shard {k}")
        finally:
            await worker.stop()
            await amq.close()

    asyncio.run(main())
    assert got == list(names)


def test_cli_queue_stats_sums_the_shards_under_the_logical_name(
    backend: Backend, mq: EchoMQ, capsys: Any
) -> None:
    from echomq_core.cli import main

    names = mq.set_shards("st", 3)
    mq.queue("st").add_bulk(list(range(300)))
    parents = [f"JOB-p{i}" for i in range(12)]
    assert len({shard_of(names, p) for p in parents}) == 3  # roots on every shard
    for pid in parents:
        mq.add_flow("st", [Child(1, queue="st-kids")], parent_id=pid, barrier=True)
    url = backend.url.replace("redis://", "redis+cluster://") if backend.cluster else backend.url
    capsys.readouterr()
    assert main(["queue", "stats", "--json", "--url", url, "--prefix", mq.keys.prefix]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert sorted(doc) == ["st", "st-kids"]  # the shards are not listed as queues of their own
    assert doc["st"]["pending"] == 300 and doc["st"]["flows"]["held"] == 12
    assert doc["st"]["shards"] == list(names) and "shards" not in doc["st-kids"]
    assert main(["queue", "stats", "--url", url, "--prefix", mq.keys.prefix]) == 0
    assert f"st: 3 shards, summed ({', '.join(names)})" in capsys.readouterr().out


def test_metrics_sum_the_shards_under_the_logical_name(mq: EchoMQ) -> None:
    from echomq_core.seeing.metrics import QueueCollector

    assert len(mq.set_shards("mt", 3)) == 3
    mq.queue("mt").add_bulk(list(range(90)))
    mq.queue("mt-plain").add_bulk(list(range(5)))
    readings = {r.queue: r for r in QueueCollector(mq).read()}
    assert sorted(readings) == ["mt", "mt-plain"]
    assert readings["mt"].jobs["pending"] == 90 and readings["mt-plain"].jobs["pending"] == 5
    fixed = QueueCollector(mq, ["mt"]).read()
    assert [(r.queue, r.jobs["pending"]) for r in fixed] == [("mt", 90)]
    # every gauge of the scrape is labelled with the logical name, none with a shard's: also
    # the workers gauge, although a worker's registry entry lists the shards it serves
    worker = Worker(mq, {"mt": lambda job: None}).start()
    try:
        families = list(QueueCollector(mq).collect())
    finally:
        worker.stop()
    labelled = {s.labels["queue"] for f in families for s in f.samples if "queue" in s.labels}
    assert labelled == {"mt", "mt-plain"}, labelled
    served = {s.labels["queue"]: s.value for f in families for s in f.samples
              if f.name == "echomq_workers"}  # fmt: skip
    assert served["mt"] == 1


def test_claims_take_the_shards_in_turn(mq: EchoMQ) -> None:
    """No shard starves: a plain claim and a worker's fetcher both start each claim at the
    next shard, so with every shard holding work, consecutive claims visit them all."""
    names = mq.set_shards("fair", 3)
    queue = mq.queue("fair")
    queue.add_bulk(list(range(300)))
    firsts = [queue.claim(5)[0].shard for _ in range(6)]
    assert firsts == [*names, *names]
    mq.set_shards("wfair", 3)
    mq.queue("wfair").add_bulk(list(range(300)))
    order: list[str] = []
    worker = Worker(mq, {"wfair": lambda job: order.append(job.shard)}, max_batch=1)
    worker.start()
    try:
        eventually(lambda: len(order) >= 30, timeout=30, what=lambda: len(order))
    finally:
        worker.stop()
    share = Counter(order[:30])
    assert set(share) == set(mq.shards("wfair")) and min(share.values()) >= 5, share


def test_retention_applies_to_every_shard(mq: EchoMQ) -> None:
    """Settings made before sharding are copied to the new shards; settings made after go to
    every shard (each shard's sweep reads its own config)."""
    mq.set_retention("ret", completed_age=60)
    names = mq.set_shards("ret", 3)
    mq.set_retention("ret", dead_count=5)
    for name in names:
        got = mq.perform(retention.get_config(mq.keys, name))
        assert (got["completed_age"], got["dead_count"]) == (60, 5), name
    assert mq.shards("ret") == names  # the copy did not touch the shards field


def test_a_re_add_converges_and_a_replace_takes_new_shards(backend: Backend, mq: EchoMQ) -> None:
    names = mq.set_shards("rk", 3)
    pid = "JOB-af/dag/replace/77aa"
    kids = [Child(i, queue="rk") for i in range(60)]
    first = mq.add_flow("rp", kids, parent_id=pid, barrier=True)
    other = backend.client(mq.keys.prefix)  # a retry from another process: same placement
    again = other.add_flow("rp", [Child(i, queue="rk") for i in range(60)], parent_id=pid,
                           barrier=True)  # fmt: skip
    assert again.children == first.children
    assert mq.queue("rk").stats()["pending"] == 60
    new = mq.add_flow("rp", [Child(i, queue="rk") for i in range(30)], parent_id=pid,
                      barrier=True, replace=True)  # fmt: skip
    assert len(new.children) == 30 and {q for q, _ in new.children} == set(names)
    assert all(q == shard_of(names, i) for q, i in new.children)
    assert mq.queue("rk").stats()["pending"] == 30
    other.close()


def test_cli_flow_show_by_the_logical_name(backend: Backend, mq: EchoMQ, capsys: Any) -> None:
    from echomq_core.cli import main

    names = mq.set_shards("fs", 3)
    pid = next(p for p in (f"JOB-fs{i}" for i in range(100)) if shard_of(names, p) != "fs")
    mq.add_flow("fs", [Child(i, queue="fs") for i in range(5)], parent_id=pid, barrier=True)
    url = backend.url.replace("redis://", "redis+cluster://") if backend.cluster else backend.url
    conn = ["--url", url, "--prefix", mq.keys.prefix]
    capsys.readouterr()
    assert main(["flow", "show", "fs", pid, "--json", *conn]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["parent_id"], doc["total"], doc["dependencies"]) == (pid, 5, 5)
    worker = Worker(mq, {"fs": lambda job: job.payload})
    worker.start()
    try:  # --watch follows the flow on the parent's shard until it is released
        assert main(["flow", "show", "fs", pid, "--watch", "--timeout", "30", "--json", *conn]) == 0
    finally:
        worker.stop()
    doc = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert (doc["parent_state"], doc["processed"]) == ("released", 5)


def test_cli_flow_show_names_logical_queues_and_their_shards(
    backend: Backend, mq: EchoMQ, capsys: Any
) -> None:
    """``flow show`` of a flow whose parent and sub-flow live in sharded queues names each node
    by its logical queue and its shard, in the text and in the JSON, not by the shard alone."""
    from echomq_core.cli import main

    top, sub = mq.set_shards("ts", 3), mq.set_shards("tk", 3)
    # the parent and its sub-flow (derived id: an unsettled sub-flow is found by it) each on
    # a shard other than shard 0, so the logical names must be looked up
    pid = next(
        p
        for p in (f"JOB-af/fan/ts/{i}" for i in range(200))
        if shard_of(top, p) != "ts" and shard_of(sub, f"{p}.0") != "tk"
    )
    sid = f"{pid}.0"
    kids = [Child(i, queue="tk") for i in range(3)]
    mq.add_flow("ts", [Child(queue="tk", children=kids)], parent_id=pid, barrier=True)
    url = backend.url.replace("redis://", "redis+cluster://") if backend.cluster else backend.url
    conn = ["--url", url, "--prefix", mq.keys.prefix]
    capsys.readouterr()
    assert main(["flow", "show", "ts", pid, *conn]) == 0
    text = capsys.readouterr().out
    assert f"flow {pid} in 'ts' (shard {shard_of(top, pid)!r})" in text
    assert f"{sid} [tk, shard {shard_of(sub, sid)}] held: 3 children" in text
    assert main(["flow", "show", "ts", pid, "--json", *conn]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["queue"], doc["shard"]) == ("ts", shard_of(top, pid))
    (node,) = doc["subflows"]
    assert (node["parent_id"], node["queue"], node["shard"]) == (sid, "tk", shard_of(sub, sid))


def test_cli_pump_of_a_sharded_queue_drains_every_shard(
    backend: Backend, mq: EchoMQ, proc_env: dict[str, str]
) -> None:
    """``echomq pump QUEUE`` of a sharded queue drains every shard's outbox: the children ran
    under a worker without a Pump, so their signals wait in three outboxes."""
    import subprocess
    import sys

    names = mq.set_shards("pk", 3)
    ref = mq.add_flow("pp", [Child(i, queue="pk") for i in range(30)], barrier=True)
    worker = Worker(mq, {"pk": lambda job: job.payload}, pump=False)
    worker.start()
    try:
        eventually(lambda: mq.queue("pk").stats()["completed"] == 30, timeout=30)
    finally:
        worker.stop()
    outboxes = [mq.perform(reads.stats(mq.keys, n))["outbox"] for n in names]
    assert all(outboxes), outboxes  # every shard holds signals for the parent
    url = backend.url.replace("redis://", "redis+cluster://") if backend.cluster else backend.url
    pump = subprocess.Popen(
        [sys.executable, "-m", "echomq_core.cli", "pump", "pk", "--url", url,
         "--prefix", mq.keys.prefix],
        env=proc_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        eventually(
            lambda: mq.snapshot(ref.queue, ref.parent_id).parent_state == "released",
            timeout=30,
            what=lambda: mq.dependencies(ref.queue, ref.parent_id),
        )
    finally:
        pump.terminate()
        pump.wait(10)


def test_explicit_child_ids_dedupe_and_refuse_a_taken_one(mq: EchoMQ) -> None:
    """Explicit child ids (Airflow-derived, with '/') land on their ids' shards; the same add
    again converges, and an id taken by a plain job on its shard is refused before writing."""
    names = mq.set_shards("ek", 3)
    kids = [Child(i, queue="ek", id=f"JOB-af/dag/map/{i:03d}") for i in range(30)]
    ref = mq.add_flow("ep", kids, parent_id="JOB-af/dag/fan/1", barrier=True)
    assert {q for q, _ in ref.children} == set(names)
    mq.add_flow("ep", kids, parent_id="JOB-af/dag/fan/1", barrier=True)
    assert mq.queue("ek").stats()["pending"] == 30
    mq.queue("ek").add("plain", job_id="JOB-af/dag/other/007")
    taken = [Child(1, queue="ek", id="JOB-af/dag/other/007")]
    with pytest.raises(FlowConflict, match="JOB-af/dag/other/007"):
        mq.add_flow("ep", taken, parent_id="JOB-af/dag/fan/2", barrier=True)


@given(st.text(alphabet="abcdefgh0123-_./", min_size=1, max_size=40), st.integers(2, 8))
@settings(max_examples=60, deadline=None)
def test_standalone_names_take_distinct_slots_and_ids_stay_put(queue: str, k: int) -> None:
    names = choose(queue, k, None)
    assert names[0] == queue and len({_slot(n) for n in names}) == k
    for job_id in (f"JOB-{queue}-{i}" for i in range(20)):
        assert shard_of(names, job_id) == shard_of(names, job_id) in names


def test_cancel_and_retry_dead_by_id_reach_every_shard(mq: EchoMQ) -> None:
    mq.set_shards("cx", 3)
    queue = mq.queue("cx")
    ids = queue.add_bulk(list(range(60)))
    cancelled, left = queue.cancel([*ids, "JOB-nope"], reason="x")
    assert (cancelled, left) == (60, ["JOB-nope"])
    assert queue.stats()["dead"] == 60 and queue.stats()["pending"] == 0
    revived, left = queue.retry_dead(ids)
    assert (revived, left) == (60, [])
    assert queue.stats()["pending"] == 60
