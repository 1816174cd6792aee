"""BullMQ for Node (the reference implementation most BullMQ users run) under the workloads.

Configuration: BullMQ 6.7.0 with ioredis on Node (``bench/peers/node/package.json``; run
``npm install`` there once), library defaults (completed jobs kept, events stream at its
default cap), one worker process running one ``Worker`` per queue with ``concurrency`` C.
Jobs are added by a second Node process, the *driver*: ``Queue.addBulk`` (W1, W6) and
``FlowProducer.add`` (W2, W3: the parent job runs on the worker and reads
``getChildrenValues()``, as with BullMQ for Python). Both Node processes start, connect and
print ``BENCH-READY`` before the window opens; the harness then opens the window and writes
the command to the driver's input, so Node's start-up is never timed - unless the worker is
started after the add (``--worker-start after``): then the worker process starts when the
driver says the add returned, and its start-up is in the window. The end is watched as
for BullMQ for Python: ``ZCARD`` of the completed set, ``ZSCORE`` of the parent.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from typing import Any

from ..common import REPO, STALL, BenchError, Proc, Stopper, Window, reached, result
from . import Peer, Unsupported
from .bullmq_peer import _parent_done

NODE_DIR = REPO / "bench" / "peers" / "node"
SCRIPT = str(NODE_DIR / "peer.js")


def _version() -> str:
    try:
        package = json.loads((NODE_DIR / "node_modules" / "bullmq" / "package.json").read_text())
        node = subprocess.run(["node", "--version"], capture_output=True, text=True, timeout=10)
        return f"{package['version']} (Node {node.stdout.strip()})"
    except (OSError, ValueError, KeyError, subprocess.SubprocessError):
        return "not installed"


def _timeout(n: int) -> float:
    return max(120.0, n / 20)


def _node(mode: str, url: str, queues: str, *extra: str, ready: bool = True) -> Proc:
    """A Node process; with ``ready``, once it is connected (else at once: a worker started
    after the add, whose start-up is timed)."""
    node = shutil.which("node") or "node"
    proc = Proc(
        "",
        [SCRIPT, mode, url, queues, *extra],
        name=f"bullmq-node-{mode}",
        command=[node],
        stdin=mode == "driver",
    )
    return proc.wait_ready(settle=0.3) if ready else proc


class BullMQNodePeer(Peer):
    name = "bullmq_node"
    version = _version()
    config = (
        "BullMQ for Node with ioredis, defaults (completed jobs kept); 1 worker process, "
        "Worker concurrency=C per queue; a second Node process adds (Queue.addBulk, "
        "FlowProducer.add), both started and connected before the window opens; the parent "
        "job runs on the worker and reads getChildrenValues(); W6 processors await a 50 ms "
        "setTimeout"
    )
    notes = {
        "W4": "n/a (no outbox): a child's completion script updates its parent directly",
    }
    late_start = True

    def _early(self, procs: Stopper, url: str, queues: str) -> Proc | None:
        """The worker started before the window opens (None: it starts after the add)."""
        if self.worker_start == "after":
            return None
        return procs.add(_node("worker", url, queues, str(self.concurrency)))

    def _add(
        self, procs: Stopper, driver: Proc, command: dict[str, Any], url: str, queues: str,
        worker: Proc | None, n: int,
    ) -> Proc:
        """Tell the driver to add; a worker not started yet starts once the add returned."""
        driver.send(json.dumps(command))
        if worker is not None:
            return worker
        driver.wait_line("ADDED", _timeout(n))
        return procs.add(_node("worker", url, queues, str(self.concurrency), ready=False))

    def w1(self, url: str, n: int) -> dict[str, Any]:
        return self._flat(url, n, "w1", "noop")

    def w6(self, url: str, n: int) -> dict[str, Any]:
        return self._flat(url, n, "w6", "io")

    def w4(self, url: str, n: int) -> dict[str, Any]:
        raise Unsupported(self.notes["W4"])

    def w5(self, url: str, n: int) -> dict[str, Any]:
        raise Unsupported("not run (W2 shows the same fan-in)")

    def _flat(self, url: str, n: int, name: str, kind: str) -> dict[str, Any]:
        win = Window(url)
        try:
            with Stopper() as procs:
                early = self._early(procs, url, name)
                driver = procs.add(_node("driver", url, name))
                win.begin()
                command = {"op": "bulk", "queue": name, "n": n, "name": kind}
                worker = self._add(procs, driver, command, url, name, early, n)
                win.wait_for(
                    lambda: reached(int(win.cmd("ZCARD", f"bull:{name}:completed")), n),
                    timeout=_timeout(n),
                    what=f"{n} completions",
                    procs=[worker, driver],
                    stall=STALL,
                )
                measure = win.end()
            return result(measure, n=n, unit="jobs")
        finally:
            win.close()

    def fan_in(self, url: str, n: int, parent_q: str, child_q: str) -> dict[str, Any]:
        win = Window(url)
        queues = parent_q if parent_q == child_q else f"{child_q},{parent_q}"
        parent_id = "bench-parent"
        try:
            with Stopper() as procs:
                early = self._early(procs, url, queues)
                driver = procs.add(_node("driver", url, parent_q))
                win.begin()
                command = {"op": "flow", "parent": parent_q, "child": child_q, "n": n}
                command["id"] = parent_id
                worker = self._add(procs, driver, command, url, queues, early, n)
                win.wait_for(
                    lambda: _parent_done(win, parent_q, child_q, parent_id),
                    timeout=_timeout(n),
                    what="the parent's completion",
                    procs=[worker, driver],
                    stall=STALL,
                )
                measure = win.end()
            raw = win.r.hget(f"bull:{parent_q}:{parent_id}", "returnvalue")
            read_back = json.loads(raw) if raw else {}
            if read_back.get("count") != n or read_back.get("sum") != n * (n - 1):
                raise BenchError(f"the parent read {read_back}, expected {n} results")
            return result(measure, n=n, unit="children")
        finally:
            win.close()
