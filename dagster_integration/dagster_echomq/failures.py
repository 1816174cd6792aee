"""The errors a Dagster step raises for a flow it cannot read: one that failed or was
cancelled (:class:`FlowFailedError`, with its first failed child's traceback), and one whose
parent a worker runs (:class:`NotABarrierFlow`)."""

from __future__ import annotations

from collections.abc import Mapping

from dagster import Failure, MetadataValue

from echomq_core import ChildFailure, EchoMQ, FlowSnapshot, InvalidFlow, ParentFailed
from echomq_core.integration import SHOWN_TRACEBACK, traceback_tail

from .metadata import capped

#: The most characters of a traceback a message shows (the core's rule).
TRACEBACK_SHOWN = SHOWN_TRACEBACK


class FlowFailedError(ParentFailed, Failure):
    """Raised when a flow an asset depends on has a failed parent (a fail-the-parent child
    died) or was cancelled. ``failed`` maps each failed child id to its error;
    ``first_failure`` is the first of them with its last traceback
    (``echomq_core.ChildFailure``; None when no child died, e.g. a cancelled flow).

    It is the core's :class:`ParentFailed` (``except ParentFailed`` catches it) and a Dagster
    ``Failure``, so Dagster fails the step at once - no retry policy can revive a failed
    parent; re-executing the run from failure repairs it instead (see the IO manager) - and
    shows the failed children as metadata of the step failure. The message ends with the
    first failed child's id, error and the tail of its traceback (at most
    :data:`TRACEBACK_SHOWN` characters, whole lines): what the step's page shows first.
    """

    def __init__(
        self,
        queue: str,
        parent_id: str,
        failed: Mapping[str, str],
        reason: str | None = None,
        first_failure: ChildFailure | None = None,
    ) -> None:
        super().__init__(queue, parent_id, dict(failed))
        self.first_failure = first_failure
        message = str(self.args[0])
        if reason:
            message += f"; cancelled: {reason}"
        if first_failure is not None:
            message += f"\n\nfirst failed child: {first_failure.job_id} in "
            message += f"{first_failure.queue!r}: {first_failure.error}"
            if first_failure.traceback:
                message += f"\n{traceback_tail(first_failure.traceback)}"
        self.args = (message,)
        # Failure.__init__ ran through the MRO with the first line as description; the UI
        # shows the description and this metadata next to the step failure.
        self.description = message
        self.metadata = {
            "queue": MetadataValue.text(queue),
            "parent_id": MetadataValue.text(parent_id),
            "failed_count": MetadataValue.int(len(self.failed)),
            "failed_children": MetadataValue.json(capped(self.failed)),
        }
        if reason:
            self.metadata["cancelled"] = MetadataValue.text(reason)
        if first_failure is not None:
            self.metadata["first_failed_child"] = MetadataValue.text(first_failure.job_id)
            if first_failure.traceback:
                shown = traceback_tail(first_failure.traceback)
                self.metadata["first_traceback"] = MetadataValue.text(shown)
        self.allow_retries = False


class NotABarrierFlow(InvalidFlow):
    """Raised when Dagster is handed a flow added without ``barrier=True`` to read: an
    asset's output, an input (an ``AssetSpec`` naming it, a sensor-launched run).

    Such a flow's parent is a job: released, it goes to a worker of its queue, which runs it
    on the children's results, and its completion ends the flow. A Dagster reader cannot end
    it (``close_flow`` refuses a worker-run flow), so it would be read while its parent waits
    for a worker - for good where no worker serves that queue - and nothing would mark it
    read. Nothing is read or requested for it; add flows that Dagster reads with
    ``barrier=True`` (``EchoMQResource.add_flow``'s default). ``queue`` and ``parent_id``
    name the flow.
    """

    def __init__(self, queue: str, parent_id: str, refused: str) -> None:
        super().__init__(
            f"flow {parent_id} in {queue!r} was added without barrier=True: its parent is a job "
            f"for a worker of {queue!r}, whose completion ends the flow, and no reader can "
            f"close it; {refused} - add flows that Dagster reads with add_flow(..., barrier=True)"
        )
        self.queue = queue
        self.parent_id = parent_id


def flow_error(client: EchoMQ, snap: FlowSnapshot) -> FlowFailedError:
    """The error for a flow that failed or was cancelled, with its first failed child's
    traceback (one bounded read, ``EchoMQ.first_failure``)."""
    failed = client.failed_children(snap.queue, snap.parent_id)
    reason = snap.error if snap.outcome == "cancelled" else None
    first = client.first_failure(snap.queue, snap.parent_id)
    return FlowFailedError(snap.queue, snap.parent_id, failed, reason or None, first)
