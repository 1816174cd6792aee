"""A large flow's results read as a dict against as pandas / polars / Arrow frames
(``echomq_core.flows.frames``), on an embedded server: seconds and peak RSS of each read.

    python -m bench.result_frames [--children 200000] [--page 5000] [--runs 3]

A barrier flow of N children, each result a small dict ({"n": i, "value": i * i, "path": ...,
"ok": ...}, about 90 bytes), is added and worked off in process. Then each read runs ``--runs``
times, interleaved, each in a fresh process (so its peak RSS is its own): the process imports
what the read needs, connects, notes its RSS, reads (``iter_children_values`` in pages of
``--page``: into a dict, or through ``results_frame``), and reports the read's seconds, its peak
RSS (``VmHWM``) and that peak over the RSS before the read. Medians; prints one JSON object
and writes bench/results/result_frames.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from echomq_core import Child, EchoMQ, Pump
from echomq_core.server import EmbeddedServer

from .common import peak_rss_kib

RESULTS = Path(__file__).resolve().parent / "results" / "result_frames.json"
WAYS = ("dict", "pandas", "polars", "arrow")
PID = "JOB-af/etl/fan_out/frames200k"


def _rss_kib() -> int:
    with open("/proc/self/status") as status:
        return int(next(line for line in status if line.startswith("VmRSS:")).split()[1])


def read_once(url: str, way: str, page: int) -> dict[str, Any]:
    """One read in this process (the child side of :func:`main`)."""
    if way != "dict":
        from echomq_core.flows import frames

        frames.library(way)  # the import is not the read's
    mq = EchoMQ(url, prefix="frames")
    mq.snapshot("reports", PID)  # connected, scripts loaded
    before = _rss_kib()
    started = time.perf_counter()
    pairs = mq.iter_children_values("reports", PID, page=page)
    if way == "dict":
        got: Any = dict(pairs)
        rows = len(got)
    else:
        got = frames.results_frame(pairs, way, page=page)
        rows = got.num_rows if way == "arrow" else len(got)
    seconds = time.perf_counter() - started
    peak = peak_rss_kib()
    mq.close()
    return {
        "rows": rows,
        "seconds": seconds,
        "peak_mib": peak / 1024,
        "over_mib": (peak - before) / 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--children", type=int, default=200_000)
    parser.add_argument("--page", type=int, default=5000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--child", nargs=2, metavar=("URL", "WAY"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(read_once(args.child[0], args.child[1], args.page)))
        return
    n = args.children
    with EmbeddedServer() as server:
        mq = EchoMQ(server.url, prefix="frames")
        mq.add_flow(
            "reports",
            [Child({"n": i}, queue="work") for i in range(n)],
            parent_id=PID,
            barrier=True,
        )
        work = mq.queue("work")
        while jobs := work.claim(5000):
            work.complete_many(
                [
                    (
                        j,
                        {
                            "n": (k := j.payload["n"]),
                            "value": k * k,
                            "ok": k % 3 != 0,
                            "path": f"s3://warehouse/part-{k:06d}.parquet",
                        },
                    )
                    for j in jobs
                ]
            )
        pump = Pump(mq, ["reports", "work"])
        while pump.tick().delivered:
            pass
        assert mq.snapshot("reports", PID).released
        mq.close()
        got: dict[str, list[dict[str, Any]]] = {way: [] for way in WAYS}
        for _ in range(args.runs):
            for way in WAYS:
                out = subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "bench.result_frames",
                        "--page",
                        str(args.page),
                        "--child",
                        server.url,
                        way,
                    ],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                got[way].append(json.loads(out.stdout))
    report = {
        "children": n,
        "page": args.page,
        "runs": args.runs,
        "read": {
            way: {
                "rows": runs[0]["rows"],
                **{
                    f"{k}_median": round(statistics.median(r[k] for r in runs), 3)
                    for k in ("seconds", "peak_mib", "over_mib")
                },
                "seconds_range": [
                    round(min(r["seconds"] for r in runs), 3),
                    round(max(r["seconds"] for r in runs), 3),
                ],
            }
            for way, runs in got.items()
        },
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
