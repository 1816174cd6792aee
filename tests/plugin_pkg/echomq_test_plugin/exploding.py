"""A plugin whose every lifecycle hook raises: the worker and the Pump must log it and carry
on, and the other plugins must still receive each event."""

from __future__ import annotations

from typing import Any

from echomq_core.hooks import hookimpl


class Boom(RuntimeError):
    pass


@hookimpl
def echomq_job_completed(job: Any) -> None:
    raise Boom(f"exploding plugin: job_completed {job.id}")


@hookimpl
def echomq_job_dead(job: Any) -> None:
    raise Boom("exploding plugin: job_dead")


@hookimpl
def echomq_flow_released(parent_id: str) -> None:
    raise Boom("exploding plugin: flow_released")


@hookimpl
def echomq_flow_failed(parent_id: str) -> None:
    raise Boom("exploding plugin: flow_failed")


@hookimpl
def echomq_signal_poisoned(queue: str) -> None:
    raise Boom("exploding plugin: signal_poisoned")
