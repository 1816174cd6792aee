"""Reading a large flow's results: whole (one reader, HSCAN pages) against in slices (one
reader per slice, as Airflow mapped tasks over ``flow_slices`` read them), on an embedded
server.

    python -m bench.result_slices [--children 100000] [--size 1000] [--runs 5]

A barrier flow of N children, each result a small dict ({"n": i, "value": i * i, "path": ...},
about 80 bytes), is added and worked off in process. Then, ``--runs`` times each, interleaved:
the whole read (``iter_children_values``, pages of 5,000), and the N / size slices read one
after another (``children_values_range``: a reader per slice, as each mapped task is).
Reported: medians of seconds and of server commands, and what the metadata database would
hold: the slices' JSON against the values' JSON (what ``return_values=True`` would put in
XCom, were it not refused above ``max_values``). Prints one JSON object and writes
bench/results/result_slices.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from echomq_core import Child, EchoMQ, Pump
from echomq_core.server import EmbeddedServer

RESULTS = Path(__file__).resolve().parent / "results" / "result_slices.json"


def commands(mq: EchoMQ) -> int:
    info = mq.connection.client.info("commandstats")
    return sum(int(v["calls"]) for v in info.values())


def timed(mq: EchoMQ, read: Any) -> tuple[float, int, int]:
    """(seconds, commands, values read) of one read."""
    mq.connection.client.config_resetstat()
    started = time.perf_counter()
    count = read()
    return time.perf_counter() - started, commands(mq) - 1, count


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--children", type=int, default=100_000)
    parser.add_argument("--size", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    n, size = args.children, args.size
    with EmbeddedServer() as server:
        mq = EchoMQ(server.url, prefix="slices")
        pid = "JOB-af/etl/fan_out/3f2a9c1d"
        mq.add_flow(
            "reports",
            [Child({"n": i}, queue="work") for i in range(n)],
            parent_id=pid,
            barrier=True,
        )
        work = mq.queue("work")
        while jobs := work.claim(5000):
            done = [
                (j, {"n": j.payload["n"], "value": j.payload["n"] ** 2, "path": f"s3://b/{j.id}"})
                for j in jobs
            ]
            work.complete_many(done)
        pump = Pump(mq, ["reports", "work"])
        while pump.tick().delivered:
            pass
        assert mq.snapshot("reports", pid).released, mq.snapshot("reports", pid)
        slices = [
            {"queue": "reports", "parent_id": pid, "start": s, "stop": min(n, s + size)}
            for s in range(0, n, size)
        ]

        def whole() -> int:
            return sum(1 for _ in mq.iter_children_values("reports", pid, page=5000))

        def sliced() -> int:
            return sum(
                len(mq.children_values_range("reports", pid, p["start"], p["stop"])) for p in slices
            )

        rows: dict[str, list[tuple[float, int, int]]] = {"whole": [], "slices": []}
        for _ in range(args.runs):
            rows["whole"].append(timed(mq, whole))
            rows["slices"].append(timed(mq, sliced))
        values = [[i, v] for i, v in mq.children_values_range("reports", pid, 0, min(n, 100_000))]
        out = {
            "children": n,
            "slice_size": size,
            "slices": len(slices),
            "runs": args.runs,
            "read": {
                way: {
                    "seconds_median": round(statistics.median(r[0] for r in got), 3),
                    "commands_median": statistics.median(r[1] for r in got),
                    "values": got[0][2],
                }
                for way, got in rows.items()
            },
            "per_slice_seconds_median": round(
                statistics.median(r[0] for r in rows["slices"]) / len(slices), 5
            ),
            "xcom_bytes": {"slices": len(json.dumps(slices)), "values": len(json.dumps(values))},
        }
        mq.close()
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
