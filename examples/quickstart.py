"""Quickstart: a cross-queue flow with a worker, a Pump and a plugin, in one process.

Run it with ``python examples/quickstart.py`` (no server needed: it starts the bundled one), or
point it at yours with ``ECHOMQ_URL=redis://localhost:6379/0``. The same flow from the command
line is ``echomq demo``; across processes it is ``echomq server``, ``echomq worker --app
module:HANDLERS``, ``echomq pump`` and ``echomq flow show QUEUE PARENT_ID --watch``.
"""

from __future__ import annotations

import os
from typing import Any

from echomq_core import Child, EchoMQ, Job, Pump, Worker
from echomq_core.hooks import Hooks, hookimpl, plugin_manager
from echomq_core.server import EmbeddedServer


class PrintReleases:
    """A plugin registered in code (a distribution would declare an ``echomq.plugins`` entry
    point instead, and ``echomq worker`` / ``echomq pump`` would load it)."""

    @hookimpl
    def echomq_flow_released(self, queue: str, parent_id: str, client: EchoMQ) -> None:
        print(f"released {parent_id}: {client.dependencies(queue, parent_id)} outstanding")

    @hookimpl
    def echomq_job_dead(self, job: Job, error: str) -> None:
        print(f"dead {job.id}: {error}")


def resize(job: Job) -> Any:
    if job.payload["page"] == 13:
        raise RuntimeError("page 13 is corrupt")
    return {"page": job.payload["page"], "bytes": 1000 + job.payload["page"]}


def main() -> None:
    server = None if os.environ.get("ECHOMQ_URL") else EmbeddedServer().start()
    url = os.environ.get("ECHOMQ_URL") or server.url  # type: ignore[union-attr]
    mq = EchoMQ(url, prefix="quickstart")
    try:
        ref = mq.add_flow(
            "reports",
            [
                Child(
                    {"page": i},
                    queue="pages",
                    ignore_dependency_on_failure=(i == 13),
                    max_attempts=1,
                )
                for i in range(100)
            ],
            payload={"report": "monthly"},
        )
        hooks = Hooks(plugin_manager(PrintReleases(), entry_points=False), client=mq)
        worker = Worker(
            mq, {"pages": resize, "reports": lambda job: "assembled"}, hooks=hooks, concurrency=2
        ).start()
        pump = Pump(mq, ["pages", "reports"], hooks=hooks).start()
        try:
            snap = mq.wait(ref.queue, ref.parent_id, timeout=30)
        finally:
            worker.stop()
            pump.stop()
        values = mq.children_values(ref.queue, ref.parent_id)
        print(
            f"{snap.parent_state}: {len(values)} results, "
            f"{mq.dependencies(ref.queue, ref.parent_id)} outstanding, "
            f"ignored {mq.ignored_failures(ref.queue, ref.parent_id)}"
        )
    finally:
        mq.close()
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
