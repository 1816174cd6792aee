"""What flow control costs when it does not bind (issue 28, "Cost"): W1-W3 as ``bench.run``
runs them for EchoMQ (one worker process started after the enqueue, as a user's is), once
without any control and once with each control set far above what the run achieves:

* ``rate``: the queue's rate limit at 10,000,000 starts/s (W1, W2, W3: the child queue);
* ``cap``: ``max_running=1,000,000`` on the flow (W2, W3): every child is admitted at the add,
  each completion returns its token;
* ``threshold``: ``min_success=0.5`` on the flow (W2, W3; no child dies, so it never acts).

Variants are interleaved run by run (none, rate, cap, threshold, none, ...) on one embedded
server flushed before each run, so a noisy minute does not land on one variant only.

    python -m bench.flow_control_cost [--runs 5] [--n1 20000] [--n2 10000]

Prints a table of medians (items/s, the ratio to ``none`` in the same run set, commands per
item) and writes bench/results/issue28/flow_control_cost.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

import redis

from echomq_core import EchoMQ
from echomq_core.server import EmbeddedServer

from .peers import echomq_peer

OUT = Path(__file__).resolve().parent / "results" / "issue28"
FAR_RATE = "10000000/s"
#: With it, a burst above any claim's batch: a GCRA limit of burst 1 takes one job per claim,
#: however far above the run's rate the limit is (echomq_core.control.rates).
FAR_BURST = 10_000


class Controlled(echomq_peer.EchoMQPeer):
    """EchoMQPeer whose flows carry ``flow_options`` and whose queues carry ``rate``."""

    def __init__(self, concurrency: int, flow_options: dict[str, Any], rate: bool) -> None:
        super().__init__()
        self.concurrency = concurrency
        self.flow_options = flow_options
        self.rate = rate

    def _limit(self, url: str, *queues: str) -> None:
        if self.rate:
            mq = EchoMQ(url)
            for q in queues:
                mq.set_rate_limit(q, FAR_RATE, burst=FAR_BURST)
            mq.close()

    def w1(self, url: str, n: int) -> dict[str, Any]:
        self._limit(url, "w1")
        return super().w1(url, n)

    def fan_in(self, url: str, n: int, parent_q: str, child_q: str) -> dict[str, Any]:
        self._limit(url, child_q)
        options = self.flow_options
        real = EchoMQ.add_flow

        def add_flow(mq: EchoMQ, *args: Any, **kwargs: Any) -> Any:
            return real(mq, *args, **{**kwargs, **options})

        EchoMQ.add_flow = add_flow  # type: ignore[method-assign]
        try:
            return super().fan_in(url, n, parent_q, child_q)
        finally:
            EchoMQ.add_flow = real  # type: ignore[method-assign]


VARIANTS: dict[str, tuple[dict[str, Any], bool]] = {
    "none": ({}, False),
    "rate": ({}, True),
    "cap": ({"max_running": 1_000_000}, False),
    "threshold": ({"min_success": 0.5}, False),
}
WORKLOADS = {"W1": ("none", "rate"), "W2": tuple(VARIANTS), "W3": tuple(VARIANTS)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--n1", type=int, default=20_000)
    parser.add_argument("--n2", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=1)
    args = parser.parse_args(argv)
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        w: {v: [] for v in vs} for w, vs in WORKLOADS.items()
    }
    with EmbeddedServer() as server:
        raw = redis.Redis.from_url(server.url)
        for run in range(args.runs):
            for workload, variants in WORKLOADS.items():
                for variant in variants:
                    raw.flushall()
                    options, rate = VARIANTS[variant]
                    peer = Controlled(args.concurrency, options, rate)
                    if workload == "W1":
                        got = peer.w1(server.url, args.n1)
                    elif workload == "W2":
                        got = peer.fan_in(server.url, args.n2, "w2", "w2")
                    else:
                        got = peer.fan_in(server.url, args.n2, "w3p", "w3c")
                    runs[workload][variant].append(got)
                    print(f"run {run + 1} {workload} {variant}: {got['rate']:,.0f}/s, "
                          f"{got['commands_per_item']} cmds/item", flush=True)
        raw.close()
    summary: dict[str, dict[str, Any]] = {}
    lines = ["| workload | variant | items/s (median) | vs none | commands/item |",
             "|---|---|---|---|---|"]
    for workload, by_variant in runs.items():
        base = statistics.median(r["rate"] for r in by_variant["none"])
        for variant, got in by_variant.items():
            rate = statistics.median(r["rate"] for r in got)
            cmds = statistics.median(r["commands_per_item"] for r in got)
            summary.setdefault(workload, {})[variant] = {
                "rate_median": rate, "ratio": round(rate / base, 3), "commands_per_item": cmds,
                "rates": [r["rate"] for r in got],
            }
            lines.append(f"| {workload} | {variant} | {rate:,.0f} | {rate / base:.2f} | {cmds} |")
    table = "\n".join(lines)
    print(table)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "flow_control_cost.json").write_text(
        json.dumps({"args": vars(args), "summary": summary, "runs": runs}, indent=1)
    )
    (OUT / "flow_control_cost.md").write_text(
        "# Flow control when it does not bind: W1-W3, medians of "
        f"{args.runs} interleaved runs\n\nOne worker process (concurrency {args.concurrency}) "
        "started after the enqueue; W3's Pump a thread of the adding process; rate "
        f"{FAR_RATE} (burst {FAR_BURST:,}), cap 1,000,000, min_success 0.5 (no child dies)."
        "\n\n" + table + "\n"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
