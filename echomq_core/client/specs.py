"""A bulk add's jobs as rows: :class:`JobSpec` (a job with options) and the checks that turn
payloads and specs into the rows :func:`~echomq_core.queues.adding.add` sends - every option
checked before anything is sent."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ..checks import MAX_ATTEMPTS, MAX_DELAY, check_int, check_seconds, timeout_ms
from ..queues.adding import Row
from ..wire.keyspace import check_group, check_job_id


@dataclass(frozen=True, slots=True)
class JobSpec:
    """A job for :meth:`Queue.add_bulk` when per-job options are needed."""

    payload: Any = None
    id: str | None = None
    delay: float = 0.0
    priority: int = 0
    max_attempts: int | None = None
    timeout: float | None = None  # the handler's time limit (s); None: the queue's
    #: The job's fairness group (a tenant, a vendor account, a region): a claim serves the
    #: groups with waiting work in turn (docs/concepts/flow-control.md). None: no group.
    group: str | None = None


#: A job that named its own group: the queue's rule does not apply to it.
GIVEN = object()


def defaults(spec: JobSpec) -> bool:
    """True when ``spec`` sets nothing but its payload and group (the common bulk add of
    grouped jobs): its row needs no option checked. A bool or a NaN is not a default."""
    return (
        spec.id is None
        and spec.max_attempts is None
        and spec.timeout is None
        and type(spec.priority) is int
        and spec.priority == 0
        and type(spec.delay) in (int, float)
        and spec.delay == 0
    )


def rows_of(
    jobs: Iterable[Any], encode: Callable[[Any], bytes], attempts_default: int, stem: str
) -> tuple[list[Row], list[Any], bool]:
    """The rows of ``jobs`` (payloads or :class:`JobSpec`), ids generated as ``stem`` and the
    index where none is given; each row's payload object for the queue's group rule
    (:data:`GIVEN` for a job that named its own group); and whether any id was given (the
    add then checks each row's existence)."""
    rows: list[Row] = []
    # each row's payload object, for the queue's group rule (GIVEN: the job named its own)
    loose: list[Any] = []
    check = False
    good: set[str] = set()  # the groups checked in this call
    for index, item in enumerate(jobs):
        if not isinstance(item, JobSpec):  # a bare payload: every option is the default
            row = (f"{stem}{index:x}", encode(item), attempts_default, 0, 0, None, None)
            rows.append(row)
            loose.append(item)
            continue
        spec = item
        group = spec.group
        if group is not None and (type(group) is not str or group not in good):
            good.add(check_group(group))  # each group checked once per call
        if defaults(spec):  # a payload and maybe a group: nothing else to check
            rows.append(
                (f"{stem}{index:x}", encode(spec.payload), attempts_default, 0, 0, None, group)
            )
            loose.append(spec.payload if group is None else GIVEN)
            continue
        if spec.id is None:
            job_id = f"{stem}{index:x}"
        else:
            job_id, check = check_job_id(spec.id), True
        delay_ms = int(check_seconds("delay", spec.delay, 0.0, MAX_DELAY) * 1000)
        priority = check_int("priority", spec.priority, 0, 800)
        attempts = check_int(
            "max_attempts",
            attempts_default if spec.max_attempts is None else spec.max_attempts,
            1,
            MAX_ATTEMPTS,
        )
        limit = timeout_ms("timeout", spec.timeout)
        rows.append((job_id, encode(spec.payload), attempts, delay_ms, priority, limit, group))
        loose.append(spec.payload if group is None else GIVEN)
    return rows, loose, check
