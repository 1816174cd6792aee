"""The one plan of a step, driven by both drivers (echomq_core.wire.drivers), on both backends."""

from __future__ import annotations

import asyncio
from typing import Any

from echomq_core import AsyncEchoMQ
from echomq_core.flows import reads as flows
from echomq_core.server import _command
from echomq_core.wire.calls import Call

from ..conftest import Backend


def test_a_flushed_script_is_loaded_and_only_the_refused_calls_are_sent_again(
    backend: Backend, prefix: str
) -> None:
    """Every node forgets its scripts; a step of a plain write, a script call and a plain write
    then loads the script (on a Cluster: on the node that refused it) and sends the script call
    again - and only it: each write runs once per step, from the sync and the async driver."""
    mq = backend.client(prefix)
    amq = AsyncEchoMQ(backend.url, cluster=backend.cluster, prefix=prefix)
    counter = f"{prefix}:{{dq}}:sent"
    script_step = next(flows.snapshot(mq.keys, "dq", "JOB-none"))
    assert [c.script is not None for c in script_step] == [True]

    def step() -> list[Call]:
        return [Call.cmd("INCR", counter), *script_step, Call.cmd("INCR", counter)]

    def forget_scripts() -> None:
        for server in backend.servers:
            _command(server.host, server.port, "SCRIPT", "FLUSH")

    async def run_async() -> list[Any]:
        try:
            return await amq.connection.execute(step())
        finally:
            await amq.close()

    try:
        forget_scripts()
        first, row, second = mq.connection.execute(step())
        assert (int(first), int(second)) == (1, 2)
        assert row[0] is None  # the snapshot of a parent that does not exist: no state
        forget_scripts()
        first, row, second = asyncio.run(run_async())
        assert (int(first), int(second)) == (3, 4)
        assert row[0] is None
        assert int(mq.connection.client.get(counter)) == 4  # no write was sent twice
        if backend.cluster:
            assert mq.connection.stats["noscript"] == 1
            assert amq.connection.stats["noscript"] == 1
    finally:
        mq.close()
