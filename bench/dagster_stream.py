"""Peak memory of a Dagster asset reading a 200,000-child flow: the whole dict vs FlowStream.

    .venv/bin/python -m bench.dagster_stream [--children 200000] [--page 1000] [--out FILE]

Prints the report as JSON (and writes it to ``--out`` when given).

One embedded Valkey; one barrier flow of N children (same queue, completed here with
``claim`` / ``complete_many``, each result a small dict). Then three fresh processes, each
materializing - in process, on an ephemeral instance - an asset whose input is that flow
through ``EchoMQIOManager`` (``close_after_read`` off, so every mode reads the same flow):

* ``baseline``: the same imports, Definitions and server connection, an asset with no input;
* ``dict``: the input annotated ``dict[str, Any]`` (every result loaded at once);
* ``stream``: the input annotated ``FlowStream`` (one page of results at a time).

Each reports its peak RSS (``VmHWM``) and how long the materialization took; the figures
are memory over the baseline. Needs dagster-echomq (``bash scripts/setup.sh all``).
"""

# No ``from __future__ import annotations``: Dagster reads the asset functions' annotations
# (``FlowStream`` is imported inside ``child``) at definition time and needs them as objects.
import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
QUEUE = "bench-dagster-stream"
PARENT = "JOB-bench-dagster-stream"


def build_flow(url: str, prefix: str, n: int) -> float:
    from echomq_core import Child, EchoMQ

    started = time.monotonic()
    with EchoMQ(url, prefix=prefix) as mq:
        children = [Child({"i": i}) for i in range(n)]
        mq.add_flow(QUEUE, children, parent_id=PARENT, barrier=True)
        del children
        queue = mq.queue(QUEUE)
        while True:
            jobs = queue.claim(2000)
            if not jobs:
                break
            queue.complete_many(
                [(j, {"i": j.payload["i"], "tag": f"row-{j.payload['i']:07d}"}) for j in jobs]
            )
        snap = mq.snapshot(QUEUE, PARENT)
        assert snap.outcome == "released" and snap.processed == n, snap
    return time.monotonic() - started


def child(mode: str, url: str, prefix: str, page: int) -> dict[str, Any]:
    """Runs in a fresh process: one materialization in ``mode``; its peak RSS."""
    from dagster import AssetSpec, asset, materialize
    from dagster_echomq import EchoMQIOManager, EchoMQResource, FlowStream, flow_metadata

    flow = AssetSpec("flow", metadata=flow_metadata(QUEUE, PARENT)).with_io_manager_key("io")
    if mode == "dict":

        @asset
        def reader(flow: dict[str, Any]) -> int:
            return sum(v["i"] for v in flow.values())

    elif mode == "stream":

        @asset
        def reader(flow: FlowStream) -> int:  # type: ignore[misc]
            return sum(v["i"] for _, v in flow)

    else:

        @asset
        def reader() -> int:  # type: ignore[misc]
            return 0

    echomq = EchoMQResource(url=url, prefix=prefix)
    io = EchoMQIOManager.from_resource(echomq, page=page, close_after_read=False)
    started = time.monotonic()
    result = materialize([flow, reader], resources={"echomq": echomq, "io": io})
    elapsed = time.monotonic() - started
    assert result.success
    total = result.output_for_node("reader")
    status = Path("/proc/self/status").read_text()
    hwm_kb = int(next(line for line in status.splitlines() if line.startswith("VmHWM")).split()[1])
    return {
        "mode": mode,
        "peak_rss_mib": round(hwm_kb / 1024, 1),
        "seconds": round(elapsed, 2),
        "sum": total,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--children", type=int, default=200_000)
    parser.add_argument("--page", type=int, default=1000)
    parser.add_argument("--out", default=None, help="also write the JSON report here")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)  # mode url prefix page
    args = parser.parse_args()
    if args.child:
        mode, url, prefix, page = args.child
        print(json.dumps(child(mode, url, prefix, int(page))))
        return

    from echomq_core.server import EmbeddedServer

    server = EmbeddedServer().start()
    try:
        prefix = f"bds{int(time.time())}"
        built = build_flow(server.url, prefix, args.children)
        runs = {}
        for mode in ("baseline", "dict", "stream"):
            out = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "bench.dagster_stream",
                    "--child",
                    mode,
                    server.url,
                    prefix,
                    str(args.page),
                ],
                cwd=ROOT,
                capture_output=True,
                text=True,
            )
            if out.returncode != 0:
                raise SystemExit(f"{mode} run failed:\n{out.stderr[-3000:]}")
            runs[mode] = json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        server.stop()
    base = runs["baseline"]["peak_rss_mib"]
    report = {
        "children": args.children,
        "page": args.page,
        "flow_built_s": round(built, 1),
        "runs": runs,
        "over_baseline_mib": {
            m: round(runs[m]["peak_rss_mib"] - base, 1) for m in ("dict", "stream")
        },
        "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    assert runs["dict"]["sum"] == runs["stream"]["sum"] == sum(range(args.children))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
