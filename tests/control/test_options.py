"""One home for the Worker's and the Pump's settings: the classes, the CLI and the Dagster
resource all read echomq_core.control.options (defaults, ranges, descriptions)."""

from __future__ import annotations

import dataclasses

import pytest

from echomq_core import EchoMQ, InvalidArgument, Pump, Worker
from echomq_core.cli import build_parser
from echomq_core.cli.common import UsageError
from echomq_core.control.options import PumpOptions, WorkerOptions


def test_cli_flags_carry_the_options_defaults() -> None:
    parser = build_parser()
    worker = parser.parse_args(["worker", "--app", "m:o"])
    pump = parser.parse_args(["pump"])
    for field in dataclasses.fields(WorkerOptions):
        if field.metadata["flag"]:
            assert getattr(worker, field.name) == field.default, field.name
    for field in dataclasses.fields(PumpOptions):
        if field.metadata["flag"]:
            assert getattr(pump, field.name) == field.default, field.name
    assert parser.parse_args(["worker", "--max-batch", "7"]).max_batch == 7


def test_cli_refuses_out_of_range_flags() -> None:
    with pytest.raises(UsageError, match="between 1 and 5000"):
        build_parser().parse_args(["worker", "--max-batch", "5001"])
    with pytest.raises(UsageError, match="at most 604800 seconds"):
        build_parser().parse_args(["worker", "--timeout", "1e9"])


@pytest.mark.onlystandalone
def test_worker_and_pump_take_settings_by_name_or_whole(mq: EchoMQ) -> None:
    queue = "opts"
    worker = Worker(mq, {queue: lambda job: None}, concurrency=3, lease=5)
    assert (worker.concurrency, worker.lease, worker.max_batch) == (3, 5.0, 500)
    whole = Worker(mq, {queue: lambda job: None}, options=WorkerOptions(max_batch=9), lease=2)
    assert (whole.max_batch, whole.lease) == (9, 2.0)
    pump = Pump(mq, [queue], options=PumpOptions(page=10), lease=1)
    assert (pump.page, pump.lease_ms) == (10, 1000)
    with pytest.raises(InvalidArgument, match="WorkerOptions has no setting leese"):
        Worker(mq, {queue: lambda job: None}, leese=5)
    with pytest.raises(InvalidArgument, match=r"options must be a PumpOptions"):
        Pump(mq, [queue], options=WorkerOptions())  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match=r"poll must be"):
        WorkerOptions(poll=0)
    assert WorkerOptions(poll=1.0, max_poll=0.5).max_poll == 1.0
