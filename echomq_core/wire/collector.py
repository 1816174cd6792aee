"""Pausing Python's cyclic garbage collector around a burst of allocations.

A full collection walks every object the process tracks: in an orchestrator's task or step
process (Dagster's or Airflow's: a few hundred thousand objects once they have loaded) each
costs about 0.05-0.13 s on the benchmark machine. What triggers one is a count of allocations,
not time, so a burst that allocates much - importing redis-py with the first client, building
a flow of thousands of children - sets one off in the middle of the step. Paused, the burst's
objects are looked at by the first collection after it, and the full collection the process
was due comes where it would have come anyway without the burst (measured in a Dagster step
process: 4 full collections with the import paused, as in the same step without EchoMQ, and 5
without the pause; docs/benchmarks.md has the figures).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def paused() -> Iterator[None]:
    """Pause the collector for the block. Process-wide: a collector that was already off (the
    caller's choice) stays off; one paused by another thread's block comes back when that
    block ends."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
