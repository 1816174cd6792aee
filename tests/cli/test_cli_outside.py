"""What outside users of the ``echomq`` command met (issue 48, item 9): a pipe into ``head``,
a mistyped queue in ``queue config``, the state line of ``flow show``, the reason in a
``--watch`` timeout, and completed worker-run flows in ``flow ls``. Against real servers; the
command runs in this process where it can (fast), as a subprocess where the pipe matters.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator

import pytest

from echomq_core import Child, EchoMQ
from echomq_core.cli.common import READER_GONE
from echomq_core.errors import FlowTimeout
from echomq_core.server import EmbeddedServer
from echomq_core.wire.calls import Call, Op

from ..conftest import Backend
from ..flowkit import work_off
from ..flows.test_flow_lifecycle import sweep
from .test_cli import CLI
from .test_cli_lifecycle import Cli


@pytest.fixture
def mq_standalone(standalone_server: EmbeddedServer, prefix: str) -> Iterator[EchoMQ]:
    client = EchoMQ(standalone_server.url, prefix=prefix)
    yield client
    client.close()


@pytest.fixture
def cli(mq_standalone: EchoMQ, capsys: pytest.CaptureFixture[str]) -> Cli:
    return Cli(mq_standalone.url, mq_standalone.keys.prefix, capsys)


# -- | head ---------------------------------------------------------------------------------


def test_a_reader_that_left_ends_the_command_quietly(
    mq_standalone: EchoMQ, proc_env: dict[str, str]
) -> None:
    """``echomq ... | head``: the reader is gone before the command writes (its end of the
    pipe is closed first: no timing involved), so the first write or flush meets EPIPE. The
    command ends with 141 as a tool that SIGPIPE ended, and says nothing on stderr."""
    mq = mq_standalone
    for i in range(3):
        mq.add_flow("bp-q", [Child(i)], parent_id=f"JOB-bp{i}")
    conn = ["--url", mq.url, "--prefix", mq.keys.prefix]
    env = {k: v for k, v in proc_env.items() if k not in ("ECHOMQ_URL", "ECHOMQ_PREFIX")}
    for argv in (["flow", "ls", *conn], ["queue", "stats", *conn], ["flow", "ls", "--help"]):
        read, write = os.pipe()
        os.close(read)  # the reader left
        try:
            proc = subprocess.run(
                [*CLI, *argv], stdout=write, stderr=subprocess.PIPE, env=env, timeout=60
            )
        finally:
            os.close(write)
        # argparse's --help swallows a failed write itself and exits 0: quiet too
        status = 0 if "--help" in argv else READER_GONE
        assert (proc.returncode, proc.stderr.decode()) == (status, ""), argv


# -- queue config <typo> ----------------------------------------------------------------------


def test_queue_config_of_an_unknown_queue_is_refused_as_queue_stats_does(
    mq_standalone: EchoMQ, cli: Cli
) -> None:
    mq_standalone.register_queue("orders")
    stats = cli("queue", "stats", "ordres")
    shown = cli("queue", "config", "ordres")
    assert stats[0] == shown[0] == 1
    assert shown[1] == ""  # no table of defaults that would read as the queue's
    said = "did you mean 'orders'?"
    assert said in stats[2] and said in shown[2]
    assert "set a setting" in shown[2]
    # Setting is configuring ahead of the first job: done, with a warning for a near name...
    status, out, err = cli("queue", "config", "ordres", "--completed-age", "1h")
    assert status == 0 and "completed" in out
    assert err.startswith("echomq: warning: no queue 'ordres'") and said in err
    assert mq_standalone.retention("ordres")["completed_age"] == 3600
    # ...and none for a name like no other (a new queue), nor for a known one.
    assert cli("queue", "config", "invoices", "--dead-count", "5")[::2] == (0, "")
    assert cli("queue", "config", "orders")[::2] == (0, "")


# -- flow show's state line --------------------------------------------------------------------


def test_flow_show_says_a_state_once(mq_standalone: EchoMQ, cli: Cli) -> None:
    mq = mq_standalone
    barrier = mq.add_flow("st-p", [Child(1, queue="st-k")], barrier=True)
    worker_run = mq.add_flow("st-w", [Child(1, queue="st-k")])
    work_off(mq, ["st-k", "st-w"])  # the worker-run parent runs and completes too

    def state_line(queue: str, parent_id: str) -> str:
        status, out, _ = cli("flow", "show", queue, parent_id)
        assert status == 0
        (line,) = (x for x in out.splitlines() if x.startswith("  parent state"))
        return line

    assert state_line("st-p", barrier.parent_id) == "  parent state  released"
    mq.close_flow("st-p", barrier.parent_id)
    assert state_line("st-p", barrier.parent_id) == "  parent state  closed"
    # a job state does not say the children settled: there the note says something new
    assert state_line("st-w", worker_run.parent_id) == "  parent state  completed (released)"


# -- flow show --watch --timeout ----------------------------------------------------------------


def test_watch_timeout_names_what_holds_the_flow_up_as_wait_does(
    mq_standalone: EchoMQ, cli: Cli
) -> None:
    mq = mq_standalone
    ref = mq.add_flow("wt-p", [Child(1, queue="wt-kids"), Child(2, queue="wt-kids")])
    with pytest.raises(FlowTimeout) as waited:
        mq.wait("wt-p", ref.parent_id, timeout=0.2)
    status, out, err = cli("flow", "show", "wt-p", ref.parent_id, "--watch", "--timeout", "0.2")
    assert status == 1
    (line,) = (x for x in err.splitlines() if not x.startswith("["))  # the progress lines
    hint = "'wt-kids' has 2 pending job(s) and none running: does a worker serve it?"
    assert hint in str(waited.value)
    assert line == f"echomq: error: {waited.value}"
    assert out == ""


# -- flow ls --state completed -------------------------------------------------------------


def test_flow_ls_lists_completed_worker_run_flows_while_retention_keeps_them(
    backend: Backend, prefix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A worker-run root leaves flows:held when released, and its job then completes: before,
    no index held it, so ``flow ls`` never listed it and ``--state completed`` was refused.
    flows:completed holds it from its completion until its flow goes (retention, replace)."""
    mq = backend.client(prefix)
    url = backend.url.replace("redis://", "redis+cluster://") if backend.cluster else backend.url
    cli = Cli(url, prefix, capsys)
    done = [
        mq.add_flow(
            "wr-p", [Child(i, queue="wr-k") for i in range(3)], parent_id=f"JOB-d{n}"
        ).parent_id
        for n in range(3)
    ]
    mq.add_flow("wr-p", [Child(9, queue="wr-k")], parent_id="JOB-bar", barrier=True)
    work_off(mq, ["wr-k", "wr-p"])  # the children, then the released parents run
    mq.add_flow("wr-p", [Child(1, queue="wr-k")], parent_id="JOB-held")

    def completed() -> list[str]:
        doc = cli.json("flow", "ls", "wr-p", "--state", "completed")
        assert doc["counts"] == {"wr-p": {"completed": len(doc["flows"])}}
        assert all((f["state"], f["total"], f["settled"]) == ("completed", 3, 3)
                   for f in doc["flows"])  # fmt: skip
        return [f["parent_id"] for f in doc["flows"]]

    assert completed() == done  # oldest first
    every = cli.json("flow", "ls", "wr-p")
    assert {f["parent_id"]: f["state"] for f in every["flows"]} == {
        **dict.fromkeys(done, "completed"),
        "JOB-bar": "released",
        "JOB-held": "held",
    }
    status, out, _ = cli("flow", "ls", "wr-p", "--state", "completed")
    assert status == 0 and sum(" completed " in line for line in out.splitlines()) == 3
    # a replace takes the old flow away: its entry goes with it (reset.lua)
    mq.add_flow("wr-p", [Child(7, queue="wr-k")], parent_id=done[0], replace=True)
    assert completed() == done[1:]
    # bounded by the queue's completed retention (expire.lua): the newest one kept...
    mq.set_retention("wr-p", completed_count=1)
    sweep(mq, ["wr-p", "wr-k"])
    assert completed() == done[2:]
    # ...then none, and no key is left behind
    mq.set_retention("wr-p", completed_count=0)
    sweep(mq, ["wr-p", "wr-k"])
    assert completed() == []
    index = mq.keys.flows("wr-p", "completed")
    assert mq.perform(_exists(index)) == 0
    mq.close()


def _exists(key: str) -> Op[int]:
    (n,) = yield [Call.cmd("EXISTS", key)]
    return int(n)
