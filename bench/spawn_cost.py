"""What a spawn costs against adding the same children with the flow (issue 31, "Spawn"):
server commands per child (``INFO commandstats``: the commands scripts run count too) and the
script calls the client made, deterministic counts, no timings.

* ``added``: a flow of 1 + K children added whole;
* ``spawned``: a flow of 1 child whose handler spawns K siblings in one ``job.spawn`` call;
* ``spawned_cross``: the same, the siblings in another queue than the parent's;
* ``own``: the same child spawns K children of its own (``own=True``), then its return ends the
  run waiting for them (``lua/await.lua``: counted here too).

    python -m bench.spawn_cost [--k 1000]
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import redis

from echomq_core import Child, EchoMQ
from echomq_core.flows import spawning
from echomq_core.server import EmbeddedServer


def _stats(r: redis.Redis) -> tuple[int, dict[str, int]]:
    stats = r.info("commandstats")
    calls = {k[len("cmdstat_") :]: int(v["calls"]) for k, v in stats.items()}
    calls.pop("info", None)
    calls.pop("config|resetstat", None)
    return sum(calls.values()), calls


def run(r: redis.Redis, url: str, k: int, variant: str) -> dict[str, Any]:
    r.flushall()
    mq = EchoMQ(url, prefix="b")
    mq.register_queue("p")
    mq.register_queue("c")
    if variant == "added":
        r.config_resetstat()
        mq.add_flow("p", [Child(i) for i in range(1 + k)], barrier=True)
    else:
        ref = mq.add_flow("p", [Child("seed")], barrier=True)
        (seed,) = mq.queue("p").claim(1)
        seed.spawner = spawning.SyncSpawner(mq)
        queue = "c" if variant == "spawned_cross" else None
        r.config_resetstat()
        seed.spawn([Child(i, queue=queue) for i in range(k)], own=variant == "own")
        if variant == "own":
            assert mq.queue("p").complete_many([(seed, None)]) == [True]
    total, calls = _stats(r)
    if variant == "own":
        node = mq.snapshot("p", seed.id)
        assert (node.total, node.parent_state) == (k, "held"), node
    elif variant != "added":
        assert mq.snapshot("p", ref.parent_id).total == 1 + k
    mq.close()
    return {
        "variant": variant,
        "k": k,
        "server_commands_per_child": total / k,
        "script_calls": calls.get("evalsha", 0),  # from the client; the rest run inside them
        "commands": dict(sorted(calls.items())),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--k", type=int, default=1000)
    args = ap.parse_args()
    server = EmbeddedServer(appendonly=False).start()
    try:
        r = redis.Redis(host=server.host, port=server.port)
        out = [run(r, server.url, args.k, v) for v in ("added", "spawned", "spawned_cross", "own")]
        print(json.dumps(out, indent=2))
        r.close()
    finally:
        server.stop()


if __name__ == "__main__":
    main()
