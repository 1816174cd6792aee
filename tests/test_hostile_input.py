"""Hostile and malformed input at every public entry point, table-driven.

Each table row is (label, call, expected error). A row passes when the call raises exactly its
documented EchoMQ error (docs/troubleshooting.md, "Errors"); each test then asserts that the
server's keyspace under the test's prefix is byte-for-byte what it was before the table ran
(``keys_of`` reads every key with its type and value on every node). Where a refusal can only
come from the server after part of a multi-step add has landed (a fail-closed add), the test
instead shows that the retry converges to the flow a clean add makes.

Entry points covered: the core API (``EchoMQ``, ``AsyncEchoMQ``, ``Queue``, ``Worker``,
``Pump``, ``Child``, ``Backoff``, ``FlowRef``), the ``echomq`` command line, the Airflow
operator's argument translation (``echomq_provider.flow_specs``, pure Python), the Airflow
connection settings and the Dagster IO manager's flow reads (those two only where Airflow /
Dagster are installed, as in CI).
"""

from __future__ import annotations

import asyncio
import inspect
import math
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from echomq_provider.flow_specs import flow_target, to_children

from echomq_core import (
    AsyncEchoMQ,
    Backoff,
    Child,
    ConfigurationError,
    EchoMQ,
    FlowConflict,
    FlowRef,
    InvalidArgument,
    InvalidFlow,
    InvalidInput,
    InvalidJobId,
    InvalidPayload,
    InvalidQueueName,
    Job,
    JobSpec,
    Pump,
    Queue,
    Worker,
)
from echomq_core.cli import main as cli_main
from echomq_core.wire.connection import Call

from .chaos.harness import record
from .conftest import Backend
from .flowkit import keys_of, normalised, work_off
from .waiting import eventually

LIMIT = 1024  # max_payload_bytes of the client under test: "over a configurable size limit"

BAD_QUEUES: list[tuple[str, Any]] = [
    ("empty", ""),
    ("open brace", "a{b"),
    ("close brace", "a}b"),
    ("hash tag", "{q}"),
    ("colon", "a:b"),
    ("space", "a b"),
    ("tab", "a\tb"),
    ("newline", "a\nb"),
    ("NUL", "a\x00b"),
    ("DEL", "a\x7fb"),
    ("no-break space", "a\u00a0b"),
    ("non-ASCII", "qué"),
    ("lone surrogate", "a\ud800"),
    ("129 chars", "q" * 129),
    ("10k chars", "q" * 10_000),
    ("int", 7),
    ("bytes", b"q"),
    ("tuple", ("q",)),
    ("None", None),
]
BAD_IDS: list[tuple[str, Any]] = [
    ("empty", ""),
    ("no JOB- prefix", "job-1"),
    ("bare prefix", "JOB-"),
    ("space", "JOB-a b"),
    ("braces", "JOB-{a}"),
    ("colon", "JOB-a:b"),
    ("newline", "JOB-a\nb"),
    ("tab", "JOB-a\tb"),
    ("NUL", "JOB-a\x00b"),
    ("non-ASCII", "JOB-é"),
    ("205 chars", "JOB-" + "x" * 201),
    ("int", 5),
    ("bytes", b"JOB-a"),
]


def _circular() -> list[Any]:
    loop: list[Any] = []
    loop.append(loop)
    return loop


def _deep(levels: int) -> Any:
    value: Any = 0
    for _ in range(levels):
        value = [value]
    return value


BAD_PAYLOADS: list[tuple[str, Any]] = [
    ("object", object()),
    ("NaN", math.nan),
    ("infinity", math.inf),
    ("set", {1, 2}),
    ("bytes", b"raw"),
    ("nested object", {"k": [1, object()]}),
    ("circular", _circular()),
    ("100k-deep nesting", _deep(100_000)),
    ("over the size limit", "x" * LIMIT),
]
MALFORMED_URLS: list[tuple[str, Any]] = [
    ("empty", ""),
    ("blank", "   "),
    ("None", None),
    ("int", 6379),
    ("bytes", b"redis://h"),
    ("no scheme", "localhost:6379"),
    ("http", "http://h:1"),
    ("no host", "redis://"),
    ("password, no host", "redis://:pw@"),
    ("port not a number", "redis://h:port"),
    ("port out of range", "redis://h:99999"),
    ("negative port", "redis://h:-1"),
    ("db not a number", "redis://h/db"),
    ("db path", "redis://h/1/2"),
    ("cluster db", "redis+cluster://h:1/2"),
    ("cluster flag nonsense", "redis://h:1?cluster=maybe"),
    ("unix cluster", "unix+cluster:///tmp/s"),
    ("unix without path", "unix://"),
    ("broken IPv6", "redis://[::1"),
    ("bad option value", "redis://h:1?socket_timeout=abc"),
    ("unknown option", "redis://h:1?no_such_option=1"),
    ("bad TLS flag", "rediss://h:1?ssl_cert_reqs=bogus"),
]


#: Refused calls per backend, for the evidence row (docs/RELIABILITY.md).
TALLY: Counter[str] = Counter()


@pytest.fixture(scope="module", autouse=True)
def evidence() -> Iterator[None]:
    started = time.monotonic()
    yield
    if TALLY:
        record(
            {
                "scenario": "hostile and malformed input (standalone + cluster)",
                "parameters": "every public entry point: core API, AsyncEchoMQ, Worker, Pump, "
                "CLI, Airflow operator/sensor arguments, Dagster IO manager reads",
                "faults": ", ".join(f"{n:,} refused calls on {b}" for b, n in sorted(TALLY.items()))
                + "; keyspace compared before/after each table: unchanged",
                "lost": 0,
                "double_counted": 0,
                "poisoned": 0,
                "wall_s": round(time.monotonic() - started, 1),
            }
        )


def handle_ok(job: Job) -> Any:
    return job.payload


HANDLERS = {"hq": handle_ok}  # for `echomq worker --app tests.test_hostile_input:HANDLERS`
BAD_HANDLERS = {"a b": handle_ok}


@dataclass
class Stage:
    """What the tables act on: some state on the server that must not change."""

    backend: Backend
    prefix: str
    mq: EchoMQ
    queue: Queue
    job: Job  # a claimed job of "hq" (its lease is current)
    other: Job  # a claimed job of "hq2"
    flow: FlowRef  # a held flow in "hp", 2 children in "hc"
    plain_id: str  # a plain pending job of "hq"

    def refuses(self, rows: list[tuple[str, Callable[[], Any], type[Exception]]]) -> None:
        """Every row raises exactly its error; then the keyspace is unchanged."""
        before = keys_of(self.backend, self.prefix)
        TALLY[self.backend.name] += len(rows)
        problems = []
        for label, call, error in rows:
            try:
                result = call()
                if inspect.isawaitable(result):
                    asyncio.run(result)  # type: ignore[arg-type]
            except error:
                continue
            except Exception as exc:
                problems.append(f"{label}: {type(exc).__name__}: {exc!s:.200}")
            else:
                problems.append(f"{label}: no error (expected {error.__name__})")
        assert not problems, "\n".join(problems)
        assert keys_of(self.backend, self.prefix) == before, "a refused call changed the keyspace"

    def amq(self) -> AsyncEchoMQ:
        return AsyncEchoMQ(
            self.backend.url,
            cluster=self.backend.cluster,
            prefix=self.prefix,
            max_payload_bytes=LIMIT,
        )

    def async_call(self, method: str, *args: Any, **kwargs: Any) -> Callable[[], Any]:
        async def call() -> Any:
            amq = self.amq()
            try:
                return await getattr(amq, method)(*args, **kwargs)
            finally:
                await amq.close()

        return call


@pytest.fixture
def stage(backend: Backend, prefix: str) -> Iterator[Stage]:
    mq = backend.client(prefix, max_payload_bytes=LIMIT)
    q = mq.queue("hq")
    q.add("claimed")
    (job,) = q.claim(1)
    plain_id = q.add("pending", job_id="JOB-plain")
    q2 = mq.queue("hq2")
    q2.add("other")
    (other,) = q2.claim(1)
    flow = mq.add_flow("hp", [Child(1, queue="hc"), Child(2, queue="hc")], parent_id="JOB-flow")
    yield Stage(backend, prefix, mq, q, job, other, flow, plain_id)
    mq.close()


# -- names and ids ------------------------------------------------------------------------


def _queue_entry_points(s: Stage) -> dict[str, Callable[[Any], Any]]:
    mq = s.mq
    return {
        "EchoMQ.queue": lambda q: mq.queue(q),
        "EchoMQ.register_queue": lambda q: mq.register_queue(q),
        "EchoMQ.get_job": lambda q: mq.get_job(q, "JOB-x"),
        "EchoMQ.add_flow queue": lambda q: mq.add_flow(q, [Child(1)]),
        "Child queue": lambda q: mq.add_flow("hp", [Child(1, queue=q)]),
        "nested Child queue": lambda q: mq.add_flow("hp", [Child(1, children=[Child(2, queue=q)])]),
        "EchoMQ.children_values": lambda q: mq.children_values(q, "JOB-x"),
        "EchoMQ.dependencies": lambda q: mq.dependencies(q, "JOB-x"),
        "EchoMQ.ignored_failures": lambda q: mq.ignored_failures(q, "JOB-x"),
        "EchoMQ.failed_children": lambda q: mq.failed_children(q, "JOB-x"),
        "EchoMQ.snapshot": lambda q: mq.snapshot(q, "JOB-x"),
        "EchoMQ.iter_children_values": lambda q: list(mq.iter_children_values(q, "JOB-x")),
        "EchoMQ.wait": lambda q: mq.wait(q, "JOB-x", timeout=0),
        "Worker handlers": lambda q: Worker(mq, {q: handle_ok}),
        "Pump queues": lambda q: Pump(mq, [q]),
        "AsyncEchoMQ.add_flow": lambda q: s.async_call("add_flow", q, [Child(1)])(),
        "AsyncEchoMQ.children_values": lambda q: s.async_call("children_values", q, "JOB-x")(),
        "AsyncEchoMQ.wait": lambda q: s.async_call("wait", q, "JOB-x", timeout=0)(),
        # the Airflow operator's and sensor's arguments, as they reach the core
        "operator child spec queue": lambda q: to_children([{"payload": 1, "queue": q}]),
        "operator child_queue": lambda q: mq.add_flow("hp", to_children([1], default_queue=q)),
        "sensor parent_queue": lambda q: flow_target(queue=q, parent_id="JOB-x"),
    }


ENTRY_POINTS_TAKING_A_QUEUE = [
    "EchoMQ.queue",
    "EchoMQ.register_queue",
    "EchoMQ.get_job",
    "EchoMQ.add_flow queue",
    "Child queue",
    "nested Child queue",
    "EchoMQ.children_values",
    "EchoMQ.dependencies",
    "EchoMQ.ignored_failures",
    "EchoMQ.failed_children",
    "EchoMQ.snapshot",
    "EchoMQ.iter_children_values",
    "EchoMQ.wait",
    "Worker handlers",
    "Pump queues",
    "AsyncEchoMQ.add_flow",
    "AsyncEchoMQ.children_values",
    "AsyncEchoMQ.wait",
    "operator child spec queue",
    "operator child_queue",
    "sensor parent_queue",
]
#: Where a queue of None means "the default" (the parent's queue), not a bad name.
NONE_IS_DEFAULT = {
    "Child queue",
    "nested Child queue",
    "operator child spec queue",
    "operator child_queue",
    "sensor parent_queue",
}


@pytest.mark.parametrize("entry", ENTRY_POINTS_TAKING_A_QUEUE)
def test_bad_queue_names(stage: Stage, entry: str) -> None:
    call = _queue_entry_points(stage)[entry]
    names = [(label, v) for label, v in BAD_QUEUES if v is not None or entry not in NONE_IS_DEFAULT]
    stage.refuses(
        [(f"{entry}({label})", lambda v=v: call(v), InvalidQueueName) for label, v in names]
    )


def _id_entry_points(s: Stage) -> dict[str, Callable[[Any], Any]]:
    mq, q = s.mq, s.queue
    return {
        "EchoMQ.get_job": lambda i: mq.get_job("hq", i),
        "Queue.get_job": lambda i: q.get_job(i),
        "Queue.add job_id": lambda i: q.add(1, job_id=i),
        "Queue.add_bulk JobSpec id": lambda i: q.add_bulk(
            [JobSpec(1, id="JOB-fine"), JobSpec(2, id=i)]
        ),
        "EchoMQ.add_flow parent_id": lambda i: mq.add_flow("hp", [Child(1)], parent_id=i),
        "Child id": lambda i: mq.add_flow("hp", [Child(1), Child(2, queue="hc", id=i)]),
        "nested Child id": lambda i: mq.add_flow("hp", [Child(1, children=[Child(2, id=i)])]),
        "EchoMQ.children_values": lambda i: mq.children_values("hp", i),
        "EchoMQ.dependencies": lambda i: mq.dependencies("hp", i),
        "EchoMQ.ignored_failures": lambda i: mq.ignored_failures("hp", i),
        "EchoMQ.failed_children": lambda i: mq.failed_children("hp", i),
        "EchoMQ.snapshot": lambda i: mq.snapshot("hp", i),
        "EchoMQ.iter_children_values": lambda i: list(mq.iter_children_values("hp", i)),
        "EchoMQ.wait": lambda i: mq.wait("hp", i, timeout=0),
        "AsyncEchoMQ.add_flow parent_id": lambda i: s.async_call(
            "add_flow", "hp", [Child(1)], parent_id=i
        )(),
        "AsyncEchoMQ.snapshot": lambda i: s.async_call("snapshot", "hp", i)(),
        "sensor parent_id": lambda i: flow_target(queue="hp", parent_id=i),
        "sensor flow mapping": lambda i: flow_target({"queue": "hp", "parent_id": i}),
    }


ENTRY_POINTS_TAKING_AN_ID = [
    "EchoMQ.get_job",
    "Queue.get_job",
    "Queue.add job_id",
    "Queue.add_bulk JobSpec id",
    "EchoMQ.add_flow parent_id",
    "Child id",
    "nested Child id",
    "EchoMQ.children_values",
    "EchoMQ.dependencies",
    "EchoMQ.ignored_failures",
    "EchoMQ.failed_children",
    "EchoMQ.snapshot",
    "EchoMQ.iter_children_values",
    "EchoMQ.wait",
    "AsyncEchoMQ.add_flow parent_id",
    "AsyncEchoMQ.snapshot",
    "sensor parent_id",
    "sensor flow mapping",
]


@pytest.mark.parametrize("entry", ENTRY_POINTS_TAKING_AN_ID)
def test_bad_job_ids(stage: Stage, entry: str) -> None:
    call = _id_entry_points(stage)[entry]
    ids = BAD_IDS
    if entry == "sensor flow mapping":  # the mapping's values are str()-ed first, like XCom
        ids = [(label, v) for label, v in BAD_IDS if isinstance(v, str)]
    stage.refuses(
        [(f"{entry}({label})", lambda v=value: call(v), InvalidJobId) for label, value in ids]
    )


# -- payloads and results -----------------------------------------------------------------


def test_bad_payloads_and_results(stage: Stage) -> None:
    mq, q, job = stage.mq, stage.queue, stage.job
    entry_points: dict[str, Callable[[Any], Any]] = {
        "Queue.add": lambda p: q.add(p),
        "Queue.add_bulk (after a good one)": lambda p: q.add_bulk([1, p]),
        "Queue.add_bulk JobSpec": lambda p: q.add_bulk([JobSpec(p, id="JOB-fine")]),
        "EchoMQ.add_flow payload": lambda p: mq.add_flow("hp", [Child(1)], payload=p),
        "Child payload": lambda p: mq.add_flow("hp", [Child(1, queue="hc"), Child(p, queue="hc")]),
        "nested Child payload": lambda p: mq.add_flow("hp", [Child(1, children=[Child(p)])]),
        "Queue.complete result": lambda p: q.complete(job, p),
        "Queue.complete_many result": lambda p: q.complete_many([(job, 1), (job, p)]),
        "AsyncEchoMQ.add_flow payload": lambda p: stage.async_call("add_flow", "hp", [Child(p)])(),
        "operator child spec payload": lambda p: mq.add_flow("hp", to_children([{"payload": p}])),
    }
    rows = [
        (f"{entry}({label})", lambda c=call, v=value: c(v), InvalidPayload)
        for entry, call in entry_points.items()
        for label, value in BAD_PAYLOADS
    ]

    class Exploding:
        def dumps(self, value: Any) -> bytes:
            raise RuntimeError("serializer exploded")

        def loads(self, data: bytes) -> Any:
            raise RuntimeError("serializer exploded")

    class Stringy:  # returns text, not bytes: accepted if it fits, limit still enforced
        def dumps(self, value: Any) -> Any:
            return 12345

        def loads(self, data: bytes) -> Any:
            return data

    for name, ser in (("raising serializer", Exploding()), ("non-bytes serializer", Stringy())):
        other = stage.backend.client(stage.prefix, serializer=ser)
        rows.append((name, lambda o=other: o.queue("hq").add(1), InvalidPayload))
    stage.refuses(rows)
    # the limit is configurable and exact: LIMIT bytes pass, LIMIT + 1 do not
    exact = "x" * (LIMIT - 2)  # JSON adds the two quotes
    assert len(mq.encode(exact)) == LIMIT
    with pytest.raises(InvalidPayload):
        mq.encode(exact + "x")


# -- flow shapes and policies ---------------------------------------------------------------


def test_malformed_flows(stage: Stage) -> None:
    mq = stage.mq
    twice = Child(1, children=[Child(9)])  # a sub-flow: given twice, refused
    selfish = Child(1)
    selfish.children = [selfish]
    a, b = Child("a"), Child("b")
    a.children, b.children = [b], [a]
    deep = top = Child(0, id="JOB-d0")
    for level in range(1, 3000):
        nxt = Child(level, id=f"JOB-d{level}")
        deep.children = [nxt]
        deep = nxt
    shapes: list[tuple[str, Any, type[Exception]]] = [
        ("no children", [], InvalidFlow),
        ("children None", None, InvalidFlow),
        ("children a string", "abc", InvalidFlow),
        ("children a dict", {"a": Child(1)}, InvalidFlow),
        # a generator of Child is a flow (issue 48); one of something else is not
        ("children a generator of ints", (i for i in range(2)), InvalidFlow),
        ("children a single Child", Child(1), InvalidFlow),
        ("not a Child", [Child(1), {"payload": 2}], InvalidFlow),
        ("duplicate ids", [Child(1, id="JOB-dup"), Child(2, id="JOB-dup")], InvalidFlow),
        (
            "duplicate across levels",
            [Child(1, id="JOB-x", children=[Child(2, id="JOB-x")])],
            InvalidFlow,
        ),
        ("explicit id = derived id", [Child(1), Child(2, id="JOB-shape.0")], InvalidFlow),
        ("explicit id = a later derived id", [Child(1, id="JOB-shape.1"), Child(2)], InvalidFlow),
        (
            "explicit id = a derived grandchild's",
            [Child(1, children=[Child(2)]), Child(3, id="JOB-shape.0.0")],
            InvalidFlow,
        ),
        ("child with the parent's id", [Child(1, id="JOB-shape")], InvalidFlow),
        ("same sub-flow twice", [twice, Child(2, children=[twice])], InvalidFlow),
        ("self cycle", [selfish], InvalidFlow),
        ("two-node cycle", [a], InvalidFlow),
        ("3000 levels deep", [top], InvalidFlow),
        ("nested children not a list", [Child(1, children=Child(2))], InvalidFlow),  # type: ignore[arg-type]
        ("neither policy", [Child(1, fail_parent_on_failure=False)], InvalidFlow),
        ("policy flag 'yes'", [Child(1, ignore_dependency_on_failure="yes")], InvalidFlow),  # type: ignore[arg-type]
        ("policy flag 'no' (truthy)", [Child(1, ignore_dependency_on_failure="no")], InvalidFlow),  # type: ignore[arg-type]
        ("policy flag None", [Child(1, fail_parent_on_failure=None)], InvalidFlow),  # type: ignore[arg-type]
        ("policy flag 1", [Child(1, ignore_dependency_on_failure=1)], InvalidFlow),  # type: ignore[arg-type]
        ("child max_attempts 0", [Child(1, max_attempts=0)], InvalidFlow),
        ("child max_attempts -1", [Child(1, max_attempts=-1)], InvalidFlow),
        ("child max_attempts '2'", [Child(1, max_attempts="2")], InvalidFlow),  # type: ignore[arg-type]
        ("child max_attempts True", [Child(1, max_attempts=True)], InvalidFlow),
        ("child max_attempts 2.5", [Child(1, max_attempts=2.5)], InvalidFlow),  # type: ignore[arg-type]
    ]
    rows: list[tuple[str, Callable[[], Any], type[Exception]]] = [
        (label, lambda c=children: mq.add_flow("hp", c, parent_id="JOB-shape"), error)
        for label, children, error in shapes
    ]
    rows += [
        (
            f"add_flow max_attempts {v!r}",
            lambda v=v: mq.add_flow("hp", [Child(1)], max_attempts=v),
            InvalidArgument,
        )
        for v in (0, -1, "3", True, 2.5, None)
    ]
    # refused by the server (the parent exists in another shape): still nothing written
    rows += [
        (
            "parent id of a plain job",
            lambda: mq.add_flow("hq", [Child(1)], parent_id="JOB-plain"),
            FlowConflict,
        ),
        (
            "existing parent, other N",
            lambda: mq.add_flow("hp", [Child(1)], parent_id="JOB-flow"),
            FlowConflict,
        ),
    ]
    # the Airflow operator's child specs (echomq_provider.flow_specs.to_children)
    specs: list[tuple[str, Any]] = [
        ("not a list", "abc"),
        ("a mapping", {"payload": 1}),
        ("unknown key", [{"payload": 1, "retries": 3}]),
        ("no payload", [{"queue": "hc"}]),
        ("ignore_failure 'yes'", [{"payload": 1, "ignore_failure": "yes"}]),
        ("max_attempts 0", [{"payload": 1, "max_attempts": 0}]),
        ("max_attempts '2'", [{"payload": 1, "max_attempts": "2"}]),
    ]
    rows += [
        (f"operator children: {label}", lambda v=v: to_children(v), InvalidInput)
        for label, v in specs
    ]
    rows += [("operator children: none", lambda: mq.add_flow("hp", to_children([])), InvalidFlow)]
    stage.refuses(rows)


# -- batch sizes, timeouts and other options ------------------------------------------------


def test_nonsense_numbers_and_options(stage: Stage) -> None:
    mq, q, job, other = stage.mq, stage.queue, stage.job, stage.other
    nan, inf = math.nan, math.inf
    B = stage.backend

    def opt(
        label: str,
        values: tuple[Any, ...],
        call: Callable[[Any], Any],
        error: type[Exception] = InvalidArgument,
    ) -> list[Any]:
        return [(f"{label}={v!r}", lambda v=v: call(v), error) for v in values]

    rows: list[Any] = []
    rows += opt(
        "EchoMQ max_payload_bytes",
        (0, -1, "1", True, 1.5),
        lambda v: EchoMQ(B.url, cluster=B.cluster, max_payload_bytes=v),
    )
    rows += opt(
        "EchoMQ prefix",
        ("", "a:b", "a b", "{p}", "x" * 33, None, 123),
        lambda v: EchoMQ(B.url, cluster=B.cluster, prefix=v),
        ConfigurationError,
    )
    rows += opt(
        "Queue max_attempts",
        (0, -1, "3", True, 2.5, 10**7),
        lambda v: mq.queue("hq", max_attempts=v),
    )
    rows += opt(
        "Queue lease", (0, -1, "1", nan, inf, True, None), lambda v: mq.queue("hq", lease=v)
    )
    rows += opt("Queue backoff", ("1s", 1000, {"base_ms": 1}), lambda v: mq.queue("hq", backoff=v))
    rows += opt("Backoff base_ms", (-1, 1.5, "1", None), lambda v: Backoff(base_ms=v))
    rows += opt("Backoff cap_ms", (5, -1, 2.5), lambda v: Backoff(base_ms=10, cap_ms=v))
    rows += opt("add delay", (-1, "1", nan, inf, True), lambda v: q.add(1, delay=v))
    rows += opt("add priority", (-1, 801, 1.5, "1", True, None), lambda v: q.add(1, priority=v))
    rows += opt("add max_attempts", (0, -1, "3", True, 10**7), lambda v: q.add(1, max_attempts=v))
    rows += opt("add_bulk jobs", ("abc", b"abc", None, 5), lambda v: q.add_bulk(v))
    rows += [
        (
            "add_bulk duplicate ids",
            lambda: q.add_bulk([JobSpec(1, id="JOB-same"), JobSpec(2, id="JOB-same")]),
            InvalidArgument,
        )
    ]
    rows += opt("claim count", (0, -1, 10_001, "5", 2.5, True, None), lambda v: q.claim(v))
    rows += opt("claim lease", (0, -1, nan, inf, "1"), lambda v: q.claim(1, lease=v))
    rows += opt("claim promote", (-1, "1", 1.5), lambda v: q.claim(1, promote=v))
    rows += opt("heartbeat lease", (0, nan, inf), lambda v: q.heartbeat([job], lease=v))
    rows += opt(
        "complete job", ("JOB-plain", None, {"id": "JOB-plain"}), lambda v: q.complete(v, 1)
    )
    rows += [
        ("complete a job of another queue", lambda: q.complete(other, 1), InvalidArgument),
        ("fail a job of another queue", lambda: q.fail(other, "x"), InvalidArgument),
        ("fail_many not a job", lambda: q.fail_many([("JOB-plain", "x", True)]), InvalidArgument),
        ("heartbeat not a job", lambda: q.heartbeat(["JOB-plain"]), InvalidArgument),
    ]  # type: ignore[list-item]
    rows += opt(
        "iter_children_values page",
        (0, -1, 100_001, "10", 1.5),
        lambda v: list(mq.iter_children_values("hp", "JOB-flow", page=v)),
    )
    rows += opt(
        "wait timeout", (-1, nan, inf, "1", None), lambda v: mq.wait("hp", "JOB-flow", timeout=v)
    )
    rows += opt(
        "wait poll", (0, -1, nan, inf), lambda v: mq.wait("hp", "JOB-flow", timeout=0, poll=v)
    )
    rows += opt(
        "AsyncEchoMQ.wait timeout",
        (-1, nan, inf),
        lambda v: stage.async_call("wait", "hp", "JOB-flow", timeout=v)(),
    )
    rows += opt(
        "AsyncEchoMQ max_payload_bytes",
        (0, "1"),
        lambda v: AsyncEchoMQ(B.url, cluster=B.cluster, max_payload_bytes=v),
    )
    h = {"hq": handle_ok}
    rows += opt("Worker handlers", ({}, "hq", [("hq", handle_ok)], None), lambda v: Worker(mq, v))
    rows += opt("Worker handler", (5, "handle_ok", None), lambda v: Worker(mq, {"hq": v}))
    rows += opt(
        "Worker concurrency", (0, -1, 1025, "2", True, 1.5), lambda v: Worker(mq, h, concurrency=v)
    )
    rows += opt("Worker max_batch", (0, 5001, "10"), lambda v: Worker(mq, h, max_batch=v))
    rows += opt("Worker lease", (0.01, 0, nan, inf), lambda v: Worker(mq, h, lease=v))
    rows += opt("Worker poll", (0, -1, nan), lambda v: Worker(mq, h, poll=v))
    rows += opt("Worker max_poll", (0, inf), lambda v: Worker(mq, h, max_poll=v))
    rows += opt("Worker grace", (-1, inf, "30"), lambda v: Worker(mq, h, grace=v))
    rows += opt("Worker fast_job", (-1, nan), lambda v: Worker(mq, h, fast_job=v))
    rows += opt("Worker flush_after", (-1, inf), lambda v: Worker(mq, h, flush_after=v))
    rows += opt(
        "Worker queue_options",
        (
            {"nonsense": 1},
            {"lease": 1},
            [("max_attempts", 1)],
            "max_attempts=1",
            {"max_attempts": 0},
            {"backoff": 5},
        ),
        lambda v: Worker(mq, h, queue_options=v),
    )
    rows += opt("Pump queues", ("hq", b"hq"), lambda v: Pump(mq, v))
    rows += opt("Pump page", (0, 100_001, "1000"), lambda v: Pump(mq, ["hq"], page=v))
    rows += opt("Pump max_tries", (0, -1, 2.5), lambda v: Pump(mq, ["hq"], max_tries=v))
    rows += opt("Pump lease", (0.05, 0, nan, inf), lambda v: Pump(mq, ["hq"], lease=v))
    rows += opt("Pump interval", (-1, nan, inf), lambda v: Pump(mq, ["hq"], interval=v))
    rows += opt("Pump max_stalls", (-1, "5"), lambda v: Pump(mq, ["hq"], max_stalls=v))
    rows += opt("Pump discover_every", (-1, inf), lambda v: Pump(mq, None, discover_every=v))
    rows += opt("Pump sweep_every", (-1, nan, inf, "1d"), lambda v: Pump(mq, ["hq"], sweep_every=v))
    rows += opt("Pump maintain_every", (-1, nan), lambda v: Pump(mq, ["hq"], maintain_every=v))
    rows += opt(
        "FlowRef.from_dict",
        ({"queue": "hp"}, "hp", None, {"queue": "hp", "parent_id": "JOB-x", "children": 5}),
        lambda v: FlowRef.from_dict(v),
        InvalidInput,
    )
    rows += opt(
        "sensor flow", ("hp/JOB-x", {"queue": "hp"}, 42), lambda v: flow_target(v), InvalidInput
    )
    rows += [
        (
            "sensor flow and queue",
            lambda: flow_target({"queue": "hp", "parent_id": "JOB-x"}, queue="hp"),
            InvalidInput,
        )
    ]
    stage.refuses(rows)


# -- connection URLs ------------------------------------------------------------------------


def test_malformed_urls(stage: Stage) -> None:
    rows: list[Any] = []
    for label, url in MALFORMED_URLS:
        rows.append((f"EchoMQ({label})", lambda u=url: EchoMQ(u), ConfigurationError))
        rows.append((f"AsyncEchoMQ({label})", lambda u=url: AsyncEchoMQ(u), ConfigurationError))
    rows.append(
        ("bad redis option", lambda: EchoMQ("redis://h:1", no_such_option=1), ConfigurationError)
    )
    stage.refuses(rows)


# -- the command line -------------------------------------------------------------------------


def test_cli_refuses_with_usage_status(
    stage: Stage, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    url = (
        stage.backend.url.replace("redis://", "redis+cluster://")
        if stage.backend.cluster
        else stage.backend.url
    )
    conn = ["--url", url, "--prefix", stage.prefix]
    lines: list[list[str]] = []
    for _, value in BAD_QUEUES:
        if not isinstance(value, str) or "\x00" in value:
            continue  # argv carries only strings without NUL
        lines += [
            ["queue", "stats", value],
            ["flow", "show", value, "JOB-flow"],
            ["poison", "list", value],
            ["poison", "replay", value],
            ["pump", value],
        ]
    for _, value in BAD_IDS:
        if isinstance(value, str) and "\x00" not in value:
            lines.append(["flow", "show", "hp", value])
    lines += [
        ["poison", "list", "hq", "--count", "0"],
        ["poison", "replay", "hq", "--count", "-1"],
        ["flow", "show", "hp", "JOB-flow", "--watch", "--timeout", "-1"],
        ["flow", "show", "hp", "JOB-flow", "--watch", "--interval", "nan"],
        ["pump", "--page", "0"],
        ["pump", "--lease", "inf"],
        ["pump", "--max-tries", "x"],
        ["worker", "--app", "tests.test_hostile_input:HANDLERS", "--concurrency", "0"],
        ["worker", "--app", "tests.test_hostile_input:HANDLERS", "a b"],
        ["worker", "--app", "tests.test_hostile_input:BAD_HANDLERS"],
        ["worker", "--app", "no_such_module:HANDLERS"],
        ["worker", "--app", "tests.test_hostile_input"],
    ]
    problems = []
    before = keys_of(stage.backend, stage.prefix)
    TALLY[stage.backend.name] += len(lines) + len(MALFORMED_URLS) + 3
    for line in lines:
        status = cli_main([*line, *conn])
        err = capsys.readouterr().err.strip()
        if status != 2 or "\n" in err or not err.startswith("echomq"):
            problems.append(f"{line!r}: status {status}, stderr {err!r}")
    for label, bad_url in MALFORMED_URLS:
        if isinstance(bad_url, str):
            status = cli_main(["queue", "stats", "--url", bad_url])
            err = capsys.readouterr().err.strip()
            if status != 2 or "\n" in err:
                problems.append(f"--url {label}: status {status}, stderr {err!r}")
    for line in (["--prefix", "a b"], ["--prefix", "p:q"], ["--connect-timeout", "-1"]):
        status = cli_main(["queue", "stats", "--url", url, *line])
        err = capsys.readouterr().err.strip()
        if status != 2:
            problems.append(f"{line!r}: status {status}, stderr {err!r}")
    assert not problems, "\n".join(problems)
    assert keys_of(stage.backend, stage.prefix) == before


# -- what only the server can refuse ----------------------------------------------------------


def test_scripts_refuse_bad_ids_on_their_own(stage: Stage) -> None:
    """A client that skips the host's checks still cannot write a key that breaks the grammar:
    each script refuses a bad id (EMQKIND) before it writes anything."""
    mq, ks = stage.mq, stage.mq.keys
    good_row = ks.job("hq", "JOB-fine")
    calls = {
        "add": Call.lua(
            "add",
            [*ks.queue_keys("hq"), good_row, good_row, ks.fair("hq")],
            ["1", 3, 0, 0, "", "", "", "", "JOB-fine", b"1", "JOB-a b", b"2"],
        ),
        "add, generated ids": Call.lua(
            "add",
            [*ks.queue_keys("hq"), good_row, ks.fair("hq")],
            ["0", 3, 0, 0, "", "JOB-a b-", 0, "", b"1"],
        ),
        "land": Call.lua(
            "land",
            [*ks.queue_keys("hq"), good_row, ks.fair("hq")],
            ["1", "JOB-flow", "hp", "fp", 3, "", 0, "", "", "", "", "JOB-{x}", b"1"],
        ),
        "land, derived ids": Call.lua(
            "land",
            [*ks.queue_keys("hq"), good_row, ks.fair("hq")],
            ["0", "JOB-flow", "hp", "fp", 3, "", 0, "", "JOB-{x}.", 0, "", b"1"],
        ),
        "hold": Call.lua(
            "hold",
            [*ks.queue_keys("hq"), good_row, good_row + ":dependencies"],
            ["JOB-\nx", b"1", 2, 3, "", "", "fp", "0" * 24, ""],
        ),
    }
    rows = [
        (name, lambda c=call: mq.connection.execute([c]), InvalidJobId)
        for name, call in calls.items()
    ]
    stage.refuses(rows)


def test_add_with_a_taken_id_is_refused_before_anything_is_written(
    backend: Backend, prefix: str
) -> None:
    """A flow whose sub-parent id is already taken by a plain job: refused (FlowConflict,
    naming the id) by the read that checks explicit ids, before the root is held or a leaf
    lands. The retry with the id fixed converges to exactly what a clean add writes."""
    mq = backend.client(prefix)
    clean = backend.client(prefix + "c")
    parents, work = backend.queues_on_distinct_nodes(2, "fc")

    def tree(sub_id: str) -> list[Child]:
        return [Child(i, queue=work) for i in range(1200)] + [
            Child("sub", id=sub_id, children=[Child(i, queue=work) for i in range(5)])
        ]

    for client in (mq, clean):
        client.queue(parents).add("someone else's job", job_id="JOB-taken")
    before = normalised(backend, prefix)
    with pytest.raises(FlowConflict, match="JOB-taken"):
        mq.add_flow(parents, tree("JOB-taken"), parent_id="JOB-fc", payload="p")
    assert normalised(backend, prefix) == before  # nothing written, not even the registry
    mq.add_flow(parents, tree("JOB-sub"), parent_id="JOB-fc", payload="p")  # the retry
    clean.add_flow(parents, tree("JOB-sub"), parent_id="JOB-fc", payload="p")
    assert normalised(backend, prefix) == normalised(backend, prefix + "c")
    work_off(mq, [parents, work], lambda job: job.payload)
    assert len(mq.children_values(parents, "JOB-fc")) == 1201
    assert mq.children_values(parents, "JOB-sub") == {f"JOB-sub.{i}": i for i in range(5)}
    mq.close()
    clean.close()


# -- results that cannot be stored --------------------------------------------------------------


def test_unstorable_results_fail_the_job_and_the_worker_survives(
    backend: Backend, prefix: str
) -> None:
    mq = backend.client(prefix, max_payload_bytes=LIMIT)
    parents, work = backend.queues_on_distinct_nodes(2, "rs")
    bad_results: dict[str, Any] = {
        "object": object(),
        "nan": math.nan,
        "set": {1},
        "huge": "x" * LIMIT,
        "circular": _circular(),
    }
    q = mq.queue(work)
    plain = {name: q.add(name) for name in bad_results}
    good = q.add_bulk(range(50))
    fp = mq.add_flow(
        parents, [Child(1, queue=work), Child("object", queue=work)], parent_id="JOB-fp"
    )
    mq.add_flow(
        parents,
        [Child(2, queue=work), Child("set", queue=work, ignore_dependency_on_failure=True)],
        parent_id="JOB-id",
    )

    def handle(job: Job) -> Any:
        if isinstance(job.payload, str) and job.payload in bad_results:
            return bad_results[job.payload]
        return job.payload

    worker = Worker(mq, {work: handle, parents: lambda job: "parent ran"}, concurrency=2).start()
    pump = Pump(mq, [parents, work]).start()
    try:
        mq.wait(parents, "JOB-id", timeout=30)
        eventually(
            lambda: (
                sum(q.stats()[k] for k in ("completed", "dead")) == 50 + 5 + 4
                and mq.get_job(parents, "JOB-id").state == "completed"
            ),
            30,
            lambda: f"every job and the parent to finish: {q.stats()}",
            every=0.05,
        )
        assert all(t.is_alive() for t in worker._runners), "the worker survived every bad result"
    finally:
        worker.stop()
        pump.stop()
    for name, job_id in plain.items():
        info = q.get_job(job_id)
        assert info.state == "dead" and info.attempts == 1, (name, info)
        assert "result cannot be stored" in (info.error or ""), info.error
    assert all(q.get_job(i).state == "completed" for i in good)
    assert mq.snapshot(parents, "JOB-fp").parent_state == "failed"
    assert list(mq.failed_children(parents, "JOB-fp")) == [f"{fp.parent_id}.1"]
    assert mq.children_values(parents, "JOB-id") == {"JOB-id.0": 2}
    assert list(mq.ignored_failures(parents, "JOB-id")) == ["JOB-id.1"]
    assert mq.get_job(parents, "JOB-id").result == "parent ran"
    assert q.stats()["active"] == 0
    mq.close()


# -- the adapters' own arguments (only where the frameworks are installed, as in CI) --------------


def test_airflow_connection_settings_refused() -> None:
    pytest.importorskip("airflow")
    from echomq_provider.hooks.settings import EchoMQConnectionSettings

    @dataclass
    class Conn:
        conn_id: str = "echomq_test"
        host: str | None = "127.0.0.1"
        port: Any = 6379
        login: str | None = None
        password: str | None = None
        schema: Any = None

    cases: list[tuple[Conn, dict[str, Any]]] = [
        (Conn(port="abc"), {}),
        (Conn(port=70000), {}),
        (Conn(schema="db"), {}),
        (Conn(), {"clustr": True}),
        (Conn(), {"tls": "maybe"}),
        (Conn(), {"ssl_cert_reqs": "x"}),
        (Conn(schema="2"), {"cluster": True}),
    ]
    for conn, extra in cases:
        with pytest.raises(ConfigurationError):
            EchoMQConnectionSettings.from_connection(conn, extra)
    with pytest.raises(ConfigurationError):
        settings = EchoMQConnectionSettings.from_connection(Conn(), {"prefix": "a b"})
        EchoMQ(settings.url, prefix=settings.prefix)


def test_dagster_io_manager_flow_reads_refused(stage: Stage) -> None:
    pytest.importorskip("dagster")
    from dagster_echomq.io_manager import read_handle, store_handle, wait_released

    mq = stage.mq
    rows: list[Any] = [
        (
            f"flow from asset metadata: queue {label}",
            lambda v=v: wait_released(mq, FlowRef(v, "JOB-flow"), timeout=0, poll=0.01),
            InvalidQueueName,
        )
        for label, v in BAD_QUEUES
        if isinstance(v, str)
    ]
    rows += [
        (
            f"flow from asset metadata: id {label}",
            lambda v=v: wait_released(mq, FlowRef("hp", v), timeout=0, poll=0.01),
            InvalidJobId,
        )
        for label, v in BAD_IDS
        if isinstance(v, str)
    ]
    stage.refuses(rows)
    # a stored handle that is not a flow reference (written by something else): refused by type
    from dagster_echomq import io_manager

    key = ["hostile", "asset"]
    raw_key = mq.keys.ref(io_manager.handle_name(key))
    for garbage in ('{"queue": "hp"}', '["hp", "JOB-flow"]', '"hp"'):
        mq.connection.execute([Call.cmd("SET", raw_key, garbage)])
        with pytest.raises(InvalidInput):
            read_handle(mq, key)
    store_handle(mq, key, stage.flow)
    assert read_handle(mq, key) == FlowRef(stage.flow.queue, stage.flow.parent_id)


def test_stored_flow_references_that_are_not_references(stage: Stage) -> None:
    """A named flow reference (how the adapters hand flows between processes) holding
    something else - written by another program - is refused by type, and bad names are
    refused before anything is sent."""
    mq = stage.mq
    stage.refuses(
        [
            (f"save_ref name {name!r}", lambda n=name: mq.save_ref(n, stage.flow), InvalidArgument)
            for name in ("", "a b", "a{b}", "x\ny", 5, None, "x" * 513)
        ]
        + [
            (f"load_ref name {name!r}", lambda n=name: mq.load_ref(n), InvalidArgument)
            for name in ("", "a b", "a{b}")
        ]
    )
    key = mq.keys.ref("hostile")
    for garbage in (b"not json", b"\xff\xfe", b'{"queue": "hp"}', b'["hp"]', b"42", b"null"):
        mq.connection.execute([Call.cmd("SET", key, garbage)])
        with pytest.raises(InvalidInput):
            mq.load_ref("hostile")
    mq.save_ref("hostile", stage.flow)
    assert mq.load_ref("hostile") == FlowRef(stage.flow.queue, stage.flow.parent_id)
