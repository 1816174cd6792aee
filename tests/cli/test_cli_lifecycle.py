"""The lifecycle commands of ``echomq`` (issue 13): ``flow ls``, ``flow close``,
``queue config`` and the flow part of ``queue stats``, against real servers.

Most cases run in-process (``echomq_core.cli.main([...])``, output captured); the command
lines that must fail on their own, the help pages and one end-to-end pass run as
subprocesses, concurrently (see tests/cli/test_cli.py).
"""

from __future__ import annotations

import argparse
import json
import re
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from echomq_core import Child, EchoMQ, JobSpec
from echomq_core.cli import main
from echomq_core.cli.arguments import age_or_none, count_or_none, fmt_seconds
from echomq_core.cli.printing import fmt_ago, fmt_bytes, table
from echomq_core.flows.retention import MAX_AGE, MAX_COUNT, SETTINGS
from echomq_core.seeing.inspection import flow_memory
from echomq_core.server import EmbeddedServer
from echomq_core.wire.connection import Call
from echomq_core.wire.keyspace import FLOW_INDEXES, FLOW_LISTS

from ..conftest import Backend
from ..dashkit import failing_flow
from ..flowkit import work_off
from ..waiting import eventually
from .test_cli import assert_one_line_error, run, run_many

FLOW_KEYS = {
    "queue",
    "parent_id",
    "state",
    "total",
    "settled",
    "age_s",
    "in_state_s",
    "error",
    "cap",
    "allowed",
    "tolerated",
}
#: The flows of lifecycle(), by state (every other state: none).
LIFECYCLE = {**dict.fromkeys(FLOW_INDEXES, 0), "held": 1, "released": 2, "closed": 2, "failed": 1}
STAT_KEYS_ORDER = ["pending", "active", "delayed", "dead", "completed", "outbox", "poison"]
STAT_KEYS = set(STAT_KEYS_ORDER)


class Cli:
    """``echomq`` in this process, against one server and prefix."""

    def __init__(self, url: str, prefix: str, capsys: pytest.CaptureFixture[str]) -> None:
        self.conn = ["--url", url, "--prefix", prefix]
        self.capsys = capsys

    def __call__(self, *argv: str) -> tuple[int, str, str]:
        self.capsys.readouterr()
        status = main([*argv, *self.conn])
        out, err = self.capsys.readouterr()
        return status, out, err

    def json(self, *argv: str) -> Any:
        status, out, err = self(*argv, "--json")
        assert status == 0, err
        assert len(out.splitlines()) == 1  # one JSON document, on one line
        return json.loads(out)


@pytest.fixture
def env(proc_env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in proc_env.items() if k not in ("ECHOMQ_URL", "ECHOMQ_PREFIX")}


@pytest.fixture
def mq_standalone(standalone_server: EmbeddedServer, prefix: str) -> Iterator[EchoMQ]:
    client = EchoMQ(standalone_server.url, prefix=prefix)
    yield client
    client.close()


@pytest.fixture
def cli(mq_standalone: EchoMQ, capsys: pytest.CaptureFixture[str]) -> Cli:
    return Cli(mq_standalone.url, mq_standalone.keys.prefix, capsys)


def lifecycle(mq: EchoMQ) -> dict[str, str]:
    """Flows in every state of ``lc-parents`` (children in ``lc-kids`` / ``lc-bad``):
    two released, two closed, one failed, one held. Returns name -> parent id."""
    ids = {}
    for name in ("closed1", "closed2", "released1", "released2"):
        ids[name] = mq.add_flow(
            "lc-parents",
            [Child({"n": i}, queue="lc-kids") for i in range(20)],
            parent_id=f"JOB-{name}",
            barrier=True,
        ).parent_id
    ids["failed"] = mq.add_flow(
        "lc-parents",
        [Child(1, queue="lc-bad", max_attempts=1), Child(2, queue="lc-kids")],
        parent_id="JOB-failed",
        barrier=True,
    ).parent_id
    work_off(mq, ["lc-kids", "lc-bad", "lc-parents"], die=lambda job: job.queue == "lc-bad")
    ids["held"] = mq.add_flow(
        "lc-parents",
        [Child(i, queue="lc-kids") for i in range(3)],
        parent_id="JOB-held",
        barrier=True,
    ).parent_id
    assert mq.close_flow("lc-parents", ids["closed1"]) == "closed"
    assert mq.close_flow("lc-parents", ids["closed2"]) == "closed"
    return ids


# -- flow ls --------------------------------------------------------------------------------


def test_flow_ls_lists_every_state_as_a_table_and_as_json(mq_standalone: EchoMQ, cli: Cli) -> None:
    status, out, err = cli("flow", "ls")
    assert (status, out, err) == (0, f"no flows under prefix {mq_standalone.keys.prefix!r}\n", "")
    ids = lifecycle(mq_standalone)

    status, out, err = cli("flow", "ls", "lc-parents")
    assert status == 0 and err == ""
    lines = out.splitlines()
    assert lines[0] == lines[0].rstrip()  # no trailing blanks
    assert re.split(r"\s{2,}", lines[0]) == [
        "queue",
        "parent id",
        "state",
        "N",
        "settled",
        "age",
        "in state",
        "error",
    ]
    rows = [line.split() for line in lines[1:]]
    # oldest first within each state, states in index order
    assert [(r[1], r[2]) for r in rows] == [
        ("JOB-held", "held"),
        ("JOB-released1", "released"),
        ("JOB-released2", "released"),
        ("JOB-closed1", "closed"),
        ("JOB-closed2", "closed"),
        ("JOB-failed", "failed"),
    ]
    assert rows[0][3:5] == ["3", "0"] and rows[1][3:5] == ["20", "20"]
    assert "died: JOB-failed.0" in lines[-1]  # the failed flow's error, in the last column

    doc = cli.json("flow", "ls")  # every queue of the registry
    assert set(doc) == {"queues", "state", "limit", "offset", "counts", "more", "flows"}
    assert doc["queues"] == ["lc-bad", "lc-kids", "lc-parents"]
    assert (doc["state"], doc["limit"], doc["offset"], doc["more"]) == (None, 100, 0, 0)
    # flow ls counts completed worker-run flows too (none here)
    assert doc["counts"]["lc-parents"] == {**LIFECYCLE, "completed": 0}
    assert doc["counts"]["lc-kids"] == dict.fromkeys(FLOW_LISTS, 0)
    flows = {f["parent_id"]: f for f in doc["flows"]}
    assert set(flows) == set(ids.values())
    for f in doc["flows"]:
        assert set(f) == FLOW_KEYS
        assert f["queue"] == "lc-parents"
        assert f["age_s"] >= f["in_state_s"] >= 0
    assert flows["JOB-closed1"]["state"] == "closed"
    assert (flows["JOB-closed1"]["total"], flows["JOB-closed1"]["settled"]) == (20, 20)
    assert flows["JOB-failed"]["state"] == "failed"
    assert "died: JOB-failed.0" in flows["JOB-failed"]["error"]
    assert flows["JOB-held"]["error"] is None


def test_flow_ls_shows_a_flows_cap_and_threshold(mq_standalone: EchoMQ, cli: Cli) -> None:
    """A controls column appears when a listed flow has max_running or min_success."""
    capped = mq_standalone.add_flow(
        "lc-ctl", [Child(i, max_attempts=1) for i in range(10)], max_running=4, min_success=0.8
    )
    q = mq_standalone.queue("lc-ctl")
    (job,) = q.claim(1)
    q.fail(job, "bad row", retry=False)  # tolerated: 1 of the 2 allowed
    plain = mq_standalone.add_flow("lc-ctl", [Child(1)])
    status, out, err = cli("flow", "ls", "lc-ctl")
    assert status == 0 and err == ""
    lines = out.splitlines()
    assert re.split(r"\s{2,}", lines[0])[-1] == "controls"
    rows = {line.split()[1]: line for line in lines[1:]}
    assert rows[capped.parent_id].endswith("cap 4, 1 / 2 failed")
    assert not rows[plain.parent_id].rstrip().endswith("failed")
    listed = cli.json("flow", "ls", "lc-ctl")["flows"]
    (doc,) = [f for f in listed if f["parent_id"] == capped.parent_id]
    assert (doc["cap"], doc["allowed"], doc["tolerated"]) == (4, 2, 1)


def test_flow_ls_pages_per_state(mq_standalone: EchoMQ, cli: Cli) -> None:
    lifecycle(mq_standalone)
    first = cli.json("flow", "ls", "lc-parents", "--state", "released", "--limit", "1")
    assert [f["parent_id"] for f in first["flows"]] == ["JOB-released1"]
    assert (first["state"], first["counts"], first["more"]) == (
        "released",
        {"lc-parents": {"released": 2}},
        1,
    )
    second = cli.json(
        "flow", "ls", "lc-parents", "--state", "released", "--limit", "1", "--offset", "1"
    )
    assert [f["parent_id"] for f in second["flows"]] == ["JOB-released2"]
    assert second["more"] == 0
    # limit and offset apply to each state: one of each, the rest announced
    status, out, _ = cli("flow", "ls", "lc-parents", "--limit", "1")
    assert status == 0
    assert [line.split()[1] for line in out.splitlines()[1:-1]] == [
        "JOB-held",
        "JOB-released1",
        "JOB-closed1",
        "JOB-failed",
    ]
    assert out.splitlines()[-1] == "(2 more beyond this page of 1 per state: --offset 1)"
    status, out, _ = cli("flow", "ls", "lc-parents", "--state", "closed", "--offset", "5")
    assert (status, out) == (0, "no closed flows under queue 'lc-parents' past offset 5\n")
    assert cli.json("flow", "ls", "lc-kids")["flows"] == []


# -- flow close -----------------------------------------------------------------------------


def test_flow_close(mq_standalone: EchoMQ, cli: Cli) -> None:
    lifecycle(mq_standalone)
    status, out, err = cli("flow", "close", "lc-parents", "JOB-released1")
    assert (status, err) == (0, "")
    assert out == "flow JOB-released1 in 'lc-parents': closed (its retention runs)\n"
    assert [f.parent_id for f in mq_standalone.list_flows("lc-parents", "closed")] == [
        "JOB-closed1",
        "JOB-closed2",
        "JOB-released1",
    ]
    # idempotent
    assert cli.json("flow", "close", "lc-parents", "JOB-released1") == {
        "queue": "lc-parents",
        "parent_id": "JOB-released1",
        "state": "closed",
    }
    # a flow that ended otherwise is left as it is
    status, out, _ = cli("flow", "close", "lc-parents", "JOB-failed")
    assert status == 0 and out.startswith("flow JOB-failed in 'lc-parents': failed (it ended")
    assert mq_standalone.snapshot("lc-parents", "JOB-failed").parent_state == "failed"
    # held: a conflict; missing: not found - one line each, exit 1, nothing printed on stdout
    for parent, says in (
        ("JOB-held", "is held (children outstanding)"),
        ("JOB-nope", "no flow JOB-nope in queue 'lc-parents' (never added, or expired)"),
        ("JOB-held.0", "no flow JOB-held.0"),  # a child job, not a flow parent
    ):
        status, out, err = cli("flow", "close", "lc-parents", parent)
        assert (status, out) == (1, ""), err
        assert len(err.splitlines()) == 1 and err.startswith("echomq: error: ")
        assert says in err, err
    status, _, err = cli("flow", "close", "lc-kids", "JOB-held.0")
    assert status == 1 and "is a job, not a flow parent" in err
    assert mq_standalone.snapshot("lc-parents", "JOB-held").parent_state == "held"


# -- queue config ---------------------------------------------------------------------------


def test_flow_cancel_retry_and_show(mq_standalone: EchoMQ, cli: Cli) -> None:
    mq = mq_standalone
    lifecycle(mq)
    status, out, err = cli("flow", "cancel", "lc-parents", "JOB-held", "--reason", "bad input")
    assert (status, err) == (0, "")
    assert out == "flow JOB-held in 'lc-parents': cancelled (3 children stopped, 1 node(s))\n"
    assert mq.queue("lc-kids").stats()["pending"] == 0
    shown = cli.json("flow", "show", "lc-parents", "JOB-held", "--json")
    assert (shown["parent_state"], shown["error"], shown["repairs"]) == (
        "cancelled",
        "bad input",
        0,
    )
    status, out, _ = cli("flow", "show", "lc-parents", "JOB-held")
    assert "  reason        bad input" in out.splitlines()
    assert [f.parent_id for f in mq.list_flows("lc-parents", "cancelled")] == ["JOB-held"]
    # the failed flow: its dead child back to work, then released
    assert cli.json("flow", "retry", "lc-parents", "JOB-failed", "--json") == {
        "queue": "lc-parents",
        "parent_id": "JOB-failed",
        "state": "held",
        "requeued": 1,
        "nodes": 1,
        "repairs": 1,
    }
    status, out, _ = cli("flow", "retry", "lc-parents", "JOB-held")
    assert out.startswith("flow JOB-held in 'lc-parents': held; 3 children back to work")
    work_off(mq, ["lc-kids", "lc-bad", "lc-parents"])
    status, out, _ = cli("flow", "show", "lc-parents", "JOB-failed")
    assert "  repairs       1" in out.splitlines() and "released" in out
    assert cli.json("flow", "cancel", "lc-parents", "JOB-failed", "--json")["state"] == (
        "cancelled"
    )  # a released barrier flow not yet closed can be cancelled too
    for args, says in (
        (("flow", "cancel", "lc-parents", "JOB-nope"), "no flow JOB-nope"),
        (("flow", "retry", "lc-parents", "JOB-released1"), "nothing to repair"),
    ):
        status, out, err = cli(*args)
        assert (status, out) == (1, ""), err
        assert len(err.splitlines()) == 1 and says in err, err
    assert cli("flow", "cancel", "lc-parents")[0] == 2  # a bad command line


def test_flow_show_prints_the_dead_children_and_a_traceback(
    mq_standalone: EchoMQ, cli: Cli
) -> None:
    """The worker's tracebacks of a failed flow's dead children: the first by default, each
    with --tracebacks, all of them in --json."""
    ref = failing_flow(mq_standalone)
    bad, ignored = mq_standalone.child_failures(ref.queue, ref.parent_id)
    assert bad.traceback and ignored.traceback
    indented = ["    " + line for line in bad.traceback.rstrip().splitlines()]
    status, out, err = cli("flow", "show", ref.queue, ref.parent_id)
    assert (status, err) == (0, ""), err
    lines = out.splitlines()
    at = lines.index(f"  failed child  {bad.job_id} [tb-kids]: {bad.error}")
    assert lines[at + 1] == f"  ignored       {ignored.job_id} [tb-kids]: {ignored.error}"
    assert lines[at + 2 : at + 3 + len(indented)] == [f"  traceback of {bad.job_id}:", *indented]
    assert lines[-1] == "  (1 more traceback(s): --tracebacks shows each)"
    assert "in _to_int" in out and f"traceback of {ignored.job_id}" not in out
    status, out, _ = cli("flow", "show", ref.queue, ref.parent_id, "--tracebacks")
    assert f"  traceback of {ignored.job_id}:" in out.splitlines()
    assert "ValueError: invalid literal for int() with base 10: 'two'" in out
    status, out, _ = cli("flow", "show", ref.queue, ref.parent_id, "--failures", "1")
    assert f"  ignored       {ignored.job_id}" not in out
    assert "  (the first 1; 2 children died: --failures N lists more)" in out.splitlines()
    doc = cli.json("flow", "show", ref.queue, ref.parent_id)
    assert doc["failures"] == [
        {"queue": "tb-kids", "job_id": f.job_id, "error": f.error, "traceback": f.traceback,
         "ignored": f.ignored}
        for f in (bad, ignored)
    ]  # fmt: skip


def test_queue_config_shows_and_sets_every_setting(mq_standalone: EchoMQ, cli: Cli) -> None:
    assert cli("queue", "config", "cfg-q")[0] == 1  # shown, not set: an unknown queue...
    assert "cfg-q" not in mq_standalone.queues()  # ...is refused, and showing writes nothing
    mq_standalone.register_queue("cfg-q")
    shown = cli.json("queue", "config", "cfg-q")
    assert shown == {"queue": "cfg-q", "changed": [], "retention": SETTINGS}
    status, out, _ = cli("queue", "config", "cfg-q")
    assert status == 0
    lines = out.splitlines()
    assert lines[0] == "retention of queue 'cfg-q'"
    assert cells(lines[1]) == ["end state", "age", "count"]
    assert [cells(line) for line in lines[2:]] == [
        [state, f"{fmt_seconds(SETTINGS[state + '_age'])} (default)", "none (default)"]
        for state in END_STATES
    ]
    assert [line.split()[0] for line in lines[2:]][:5] == [
        "completed",
        "dead",
        "failed",
        "closed",
        "unclosed",
    ]

    status, out, err = cli(
        "queue", "config", "cfg-q",
        "--completed-age", "30", "--completed-count", "1000",
        "--dead-age", "1.5h", "--dead-count", "none",
        "--failed-age", "none", "--failed-count", "0",
        "--closed-age", "30s", "--closed-count", "5",
        "--unclosed-age", "2d", "--unclosed-count", "NONE",
        "--poison-age", "15m", "--poison-count", "7",
    )  # fmt: skip
    assert (status, err) == (0, "")
    expected = {
        **SETTINGS,
        "completed_age": 30,
        "completed_count": 1000,
        "dead_age": 5400,
        "dead_count": None,
        "failed_age": None,
        "failed_count": 0,
        "closed_age": 30,
        "closed_count": 5,
        "unclosed_age": 172800,
        "unclosed_count": None,
        "poison_age": 900,
        "poison_count": 7,
    }
    assert mq_standalone.retention("cfg-q") == expected
    assert "cfg-q" in mq_standalone.queues()  # set_retention registers the queue
    lines = out.splitlines()
    assert lines[0] == (
        "retention of queue 'cfg-q' (set: completed-age, completed-count, dead-age, "
        "dead-count, failed-age, failed-count, closed-age, closed-count, unclosed-age, "
        "unclosed-count, poison-age, poison-count)"
    )
    assert cells(lines[1]) == ["end state", "age", "count"]
    shown = {cells(line)[0]: cells(line)[1:] for line in lines[2:]}
    assert list(shown) == list(END_STATES)
    assert {state: shown[state] for state in SET_STATES} == {
        "completed": ["30s", "1,000"],
        "dead": ["90m", "none (default)"],
        "failed": ["none", "0"],
        "closed": ["30s", "5"],
        "unclosed": ["2d", "none (default)"],
        "poison": ["15m", "7"],
    }
    for state in set(END_STATES) - set(SET_STATES):  # not given: still the defaults
        assert shown[state][1] == "none (default)"
    # one option: only that one changes; JSON names it
    doc = cli.json("queue", "config", "cfg-q", "--closed-age", "0.25")
    assert doc["changed"] == ["closed_age"]
    assert doc["retention"] == {**expected, "closed_age": 0.25}


def test_queue_config_sets_shows_and_removes_the_group_rule(
    mq_standalone: EchoMQ, cli: Cli
) -> None:
    status, out, err = cli("queue", "config", "cfg-g", "--group-from", "customer")
    assert (status, err) == (0, "")
    assert "fairness groups of 'cfg-g': the payload's 'customer' (set)" in out.splitlines()
    assert mq_standalone.group_rule("cfg-g") == "customer"
    (job,) = mq_standalone.queue("cfg-g").add_bulk([{"customer": "acme"}])
    assert mq_standalone.get_job("cfg-g", job).group == "acme"  # type: ignore[union-attr]
    assert cli.json("queue", "config", "cfg-g")["group_from"] == "customer"  # shown while set
    doc = cli.json("queue", "config", "cfg-g", "--group-from", "none")
    assert (doc["changed"], doc["group_from"]) == (["group_from"], None)
    assert "group_from" not in cli.json("queue", "config", "cfg-g")  # none: not shown
    status, _, err = cli("queue", "config", "cfg-g", "--group-from", "")
    assert status != 0 and "a group rule is the payload key" in err, err
    assert mq_standalone.group_rule("cfg-g") is None
    doc = cli.json(
        "queue", "config", "cfg-g", "--group-weight", "gold=3", "--group-weight", "a=b/c=2"
    )
    assert doc["changed"] == ["group_weight"]
    assert mq_standalone.group_weight("cfg-g", "gold") == 3
    assert mq_standalone.group_weight("cfg-g", "a=b/c") == 2  # the last '=' splits
    for bad in ("gold", "gold=0", "gold=x", "=2", "gold=1001"):
        status, _, err = cli("queue", "config", "cfg-g", "--group-weight", bad)
        assert status != 0 and "invalid group weight" in err, (bad, err)
    assert mq_standalone.group_weight("cfg-g", "gold") == 3


def test_queue_stats_shows_the_groups_with_work_queued(mq_standalone: EchoMQ, cli: Cli) -> None:
    q = mq_standalone.queue("st-groups")
    q.add_bulk([JobSpec(1, group="acme") for _ in range(3)] + [JobSpec(2, group="globex")])
    status, out, _ = cli("queue", "stats", "st-groups")
    assert status == 0
    line = "st-groups: 2 groups with work queued, taking turns; busiest (jobs queued): acme 3, "
    assert line + "globex 1" in out.splitlines(), out
    doc = cli.json("queue", "stats", "st-groups")["st-groups"]
    assert doc["groups"] == {
        "waiting": 2,
        "busiest": [{"group": "acme", "queued": 3}, {"group": "globex", "queued": 1}],
        "complete": True,
    }
    mq_standalone.queue("st-plain").add(1)
    assert "groups" not in cli.json("queue", "stats", "st-plain")["st-plain"]


def cells(line: str) -> list[str]:
    """The cells of a table line (columns are two or more blanks apart)."""
    return re.split(r"\s{2,}", line.strip())


END_STATES = list(dict.fromkeys(name.rsplit("_", 1)[0] for name in SETTINGS))
SET_STATES = ["completed", "dead", "failed", "closed", "unclosed", "poison"]


# -- queue stats ----------------------------------------------------------------------------


def test_queue_stats_counts_flows_by_state_and_estimates_their_memory(
    mq_standalone: EchoMQ, cli: Cli
) -> None:
    lifecycle(mq_standalone)
    doc = cli.json("queue", "stats")
    assert set(doc) == {"lc-bad", "lc-kids", "lc-parents"}
    parents = doc["lc-parents"]
    assert set(parents) == STAT_KEYS | {"flows", "flow_memory"}
    assert parents["flows"] == LIFECYCLE
    memory = parents["flow_memory"]
    assert set(memory) == {"available", "bytes", "by_state"}
    assert memory["available"] is True
    assert set(memory["by_state"]) == set(FLOW_INDEXES)
    by_state = memory["by_state"]
    assert {s: v["sampled"] for s, v in by_state.items()} == parents["flows"]
    assert memory["bytes"] == sum(v["bytes"] for v in by_state.values())
    # a 20-child flow holds its 20 child rows (in lc-kids) and a 20-entry result hash
    assert 20 * 100 < by_state["released"]["bytes"] / 2 < 100_000
    assert by_state["closed"]["bytes"] > 0 and by_state["failed"]["bytes"] > 0
    assert doc["lc-kids"]["flows"] == dict.fromkeys(FLOW_INDEXES, 0)
    assert doc["lc-kids"]["flow_memory"]["bytes"] == 0
    assert doc["lc-kids"]["completed"] == 4 * 20 + 1

    status, out, err = cli("queue", "stats")
    assert (status, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].split() == [
        "queue", *STAT_KEYS_ORDER, *FLOW_INDEXES, "flow", "memory", "(est.)"
    ]  # fmt: skip
    row = dict(zip(["queue", *STAT_KEYS_ORDER, *FLOW_INDEXES], lines[3].split(), strict=False))
    assert row["queue"] == "lc-parents"
    assert [row[s] for s in FLOW_INDEXES] == [str(LIFECYCLE[s]) for s in FLOW_INDEXES]
    assert lines[3].endswith("KiB")
    assert lines[2].endswith(" 0 B")
    assert len(lines) == 4  # no footnote when memory is available


def test_flow_memory_samples_large_indexes_and_follows_children_to_their_node(
    backend: Backend, prefix: str
) -> None:
    """Over ten flows per state: a sample, extrapolated; children in a queue on another node
    (Cluster) are measured there."""
    mq = backend.client(prefix)
    parents, kids = backend.queues_on_distinct_nodes(2, "mem")
    try:
        for i in range(25):
            mq.add_flow(
                parents,
                [Child("x" * 100, queue=kids) for _ in range(10)],
                parent_id=f"JOB-m{i}",
                barrier=True,
            )
        held = mq.perform(flow_memory(mq.keys, parents))
        assert held.counts == {**dict.fromkeys(FLOW_INDEXES, 0), "held": 25}
        assert held.sampled["held"] == 10
        # ten rows of ~100-byte payloads below each root: far more than the root alone
        per_flow = held.bytes["held"] / 25
        assert 10 * 100 < per_flow < 20_000, per_flow
        roots_only = sum(
            int(mq.connection.execute([Call.cmd("MEMORY USAGE", k)])[0] or 0)
            for k in mq.keys.node_keys(parents, "JOB-m0")
        )
        assert per_flow > roots_only + 10 * 100
        assert held.memory_dict()["by_state"]["held"] == {
            "sampled": 10,
            "bytes": held.bytes["held"],
        }
    finally:
        mq.close()


def test_queue_stats_without_memory_usage_shows_counts(
    standalone_server: EmbeddedServer, mq_standalone: EchoMQ, cli: Cli
) -> None:
    """An ACL user that may not run MEMORY USAGE still gets every count; the memory is
    reported unavailable, with the reason, and the command succeeds."""
    lifecycle(mq_standalone)
    prefix = mq_standalone.keys.prefix
    user, password = f"nomem-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    admin = redis.Redis(host=standalone_server.host, port=standalone_server.port)
    admin.execute_command(
        "ACL", "SETUSER", user, "reset", "on", f">{password}", f"~{prefix}:*", "+@all", "-memory"
    )
    try:
        url = f"redis://{user}:{password}@{standalone_server.host}:{standalone_server.port}/0"
        cli.conn = ["--url", url, "--prefix", prefix]
        doc = cli.json("queue", "stats", "lc-parents")
        parents = doc["lc-parents"]
        assert parents["flows"] == LIFECYCLE
        assert parents["completed"] == 0 and parents["pending"] == 0
        memory = parents["flow_memory"]
        assert memory["available"] is False
        assert memory["reason"].startswith("MEMORY USAGE refused: ")
        assert "no permissions to run the 'memory|usage' command" in memory["reason"]
        status, out, err = cli("queue", "stats")
        assert (status, err) == (0, "")
        lines = out.splitlines()
        assert lines[3].split()[0] == "lc-parents" and lines[3].endswith("unavailable")
        assert lines[2].endswith(" 0 B")  # no flows: nothing to measure, nothing refused
        assert lines[-1].startswith("(flow memory unavailable: MEMORY USAGE refused: User ")
    finally:
        admin.execute_command("ACL", "DELUSER", user)
        admin.close()


# -- bad command lines, help, subprocesses ---------------------------------------------------


NEW_COMMANDS = [["flow", "ls"], ["flow", "close"], ["queue", "config"]]


def test_help_of_the_lifecycle_commands(env: dict[str, str]) -> None:
    results = run_many([[*c, "--help"] for c in NEW_COMMANDS], env)
    for command, result in zip(NEW_COMMANDS, results, strict=True):
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith(f"usage: echomq {' '.join(command)}")
    config_help = results[2].stdout
    for name in SETTINGS:
        assert "--" + name.replace("_", "-") in config_help


def test_bad_lifecycle_command_lines(
    env: dict[str, str], standalone_server: EmbeddedServer
) -> None:
    url = ["--url", standalone_server.url]
    bad = [
        ["flow", "ls", "--state", "done", *url],
        ["flow", "ls", "--limit", "0", *url],
        ["flow", "ls", "--limit", "10001", *url],
        ["flow", "ls", "--offset", "-1", *url],
        ["flow", "ls", "bad{q}", *url],
        ["flow", "ls", "q", "extra", *url],
        ["flow", "close", "q", *url],
        ["flow", "close", "q", "not-a-job-id", *url],
        ["flow", "close", "bad:q", "JOB-1", *url],
        ["queue", "config", *url],
        ["queue", "config", "q", "--closed-age", "5x", *url],
        ["queue", "config", "q", "--closed-age", "-3", *url],
        ["queue", "config", "q", "--closed-age", "3651d", *url],
        ["queue", "config", "q", "--closed-age", "", *url],
        ["queue", "config", "q", "--dead-count", "1.5", *url],
        ["queue", "config", "q", "--dead-count", "-1", *url],
        ["queue", "config", "q", "--dead-count", str(MAX_COUNT + 1), *url],
        ["queue", "config", "q", "--nosuch-age", "1", *url],
        ["queue", "config", "bad{q}", *url],
        ["queue", "stats", "q", "--memory", *url],
    ]
    for result in run_many(bad, env):
        assert_one_line_error(result, 2)
        assert result.stdout == ""


def test_end_to_end_as_subprocesses(env: dict[str, str], mq_standalone: EchoMQ) -> None:
    mq = mq_standalone
    lifecycle(mq)
    conn = ["--url", mq.url, "--prefix", mq.keys.prefix]
    closed, listed, configured, unreachable = run_many(
        [
            ["flow", "close", "lc-parents", "JOB-released2", "--json", *conn],
            ["flow", "ls", "lc-parents", "--state", "failed", "--json", *conn],
            ["queue", "config", "lc-parents", "--closed-age", "1h", "--json", *conn],
            ["flow", "ls", "--url", "redis://127.0.0.1:1"],
        ],
        env,
    )
    assert json.loads(closed.stdout)["state"] == "closed", closed.stderr
    assert [f["parent_id"] for f in json.loads(listed.stdout)["flows"]] == ["JOB-failed"]
    assert json.loads(configured.stdout)["retention"]["closed_age"] == 3600
    assert_one_line_error(unreachable, 1)
    assert "cannot reach 127.0.0.1:1" in unreachable.stderr
    stats = run("queue", "stats", "lc-parents", "--json", *conn, env=env)
    assert json.loads(stats.stdout)["lc-parents"]["flows"]["closed"] == 3


# -- the argument types and formats ----------------------------------------------------------


def test_ages_counts_and_formats() -> None:
    age = age_or_none(MAX_AGE)
    assert [age(t) for t in ("0", "30", "1.5", "30s", "15m", "2h", "7d", "None", " none ")] == [
        0, 30, 1.5, 30, 900, 7200, 604800, None, None
    ]  # fmt: skip
    assert age("3650d") == MAX_AGE
    for bad in ("", "-1", "5x", "1e3", "d", "1 2", "inf", "nan", "3651d", "1w"):
        with pytest.raises(argparse.ArgumentTypeError):
            age(bad)
    count = count_or_none(MAX_COUNT)
    assert [count(t) for t in ("0", "10", "none", str(MAX_COUNT))] == [0, 10, None, MAX_COUNT]
    for bad in ("", "-1", "1.5", "ten", str(MAX_COUNT + 1)):
        with pytest.raises(argparse.ArgumentTypeError):
            count(bad)
    # what fmt_seconds prints, age_or_none reads back
    for value in (None, 0, 0.25, 1, 59, 90, 900, 5400, 7200, 86400, 90000, 604800, MAX_AGE):
        assert age(fmt_seconds(value)) == value
    assert [fmt_seconds(v) for v in (None, 0, 0.25, 90, 5400, 86400)] == [
        "none", "0s", "0.25s", "90s", "90m", "1d"
    ]  # fmt: skip
    assert [fmt_ago(v) for v in (None, 0.04, 9.96, 42, 307, 11_100, 183_600)] == [
        "-", "0.0s", "10.0s", "42s", "5m07s", "3h05m", "2d03h"
    ]  # fmt: skip
    assert [fmt_bytes(v) for v in (None, 0, 812, 12_600, 4_718_592, 3 * 2**30)] == [
        "-", "0 B", "812 B", "12.3 KiB", "4.5 MiB", "3.0 GiB"
    ]  # fmt: skip
    assert table(["a", "n"], [["x", "1"], ["long", "1,000"]]) == [
        "a         n",
        "x         1",
        "long  1,000",
    ]


def test_queue_retry_dead_revives_plain_jobs(mq_standalone: EchoMQ, cli: Cli) -> None:
    q = mq_standalone.queue("rd-plain")
    dead = q.add("x", max_attempts=1)
    (job,) = q.claim()
    q.fail(job, "boom", retry=False)
    assert cli.json("queue", "retry-dead", "rd-plain", dead) == {
        "queue": "rd-plain",
        "revived": 1,
        "left": [],
    }
    assert q.get_job(dead).state == "pending"
    status, out, _ = cli("queue", "retry-dead", "rd-plain", dead)  # not dead now: left, exit 1
    assert status == 1 and f"left as it is (not dead, or a flow's: repair the flow): {dead}" in out
    status, _, err = cli("queue", "retry-dead", "rd-plain", "not-an-id")
    assert status == 2 and "invalid job id" in err


def test_workers_lists_the_live_workers(mq_standalone: EchoMQ, cli: Cli) -> None:
    """`echomq workers`: the registry as a table and as JSON; a stopped worker is gone."""
    from echomq_core import Worker

    status, out, err = cli("workers")
    assert (status, err) == (0, "") and out.startswith("no live workers under prefix")
    worker = Worker(mq_standalone, {"lc-w1": lambda job: 1, "lc-w2": lambda job: 2},
                    concurrency=3).start()  # fmt: skip
    try:
        me = worker.presence.entry.id
        doc = eventually(
            lambda: [w for w in cli.json("workers")["workers"] if w["id"] == me], 10, "the entry"
        )
        assert doc[0]["queues"] == ["lc-w1", "lc-w2"] and doc[0]["concurrency"] == 3
        status, out, err = cli("workers")
        assert status == 0 and err == ""
        header, *rows = out.splitlines()
        assert re.split(r"\s{2,}", header)[:5] == ["worker", "host", "pid", "kind", "queues"]
        assert [r.split()[0] for r in rows] == [me] and "lc-w1,lc-w2" in rows[0]
    finally:
        worker.stop()
    status, out, err = cli("workers")
    assert out.startswith("no live workers under prefix")
