"""The exception tree: every failure EchoMQ raises on purpose is an :class:`EchoMQError`.

Two families matter to callers:

* **Refusals** (:class:`InvalidInput` and its children) are raised *before* anything reaches
  the server, or by a script that refused the call and changed nothing. They are also
  ``ValueError`` subclasses, so generic validation code catches them too. Retrying the same
  call cannot succeed.
* **Outcomes** (:class:`JobNotFound`, :class:`LeaseLost`, :class:`FlowConflict`,
  :class:`ParentFailed`) describe the state of the server: the call was well formed, the
  state refused it.

Server-side scripts answer with an error reply whose first word is a code (``EMQKIND``,
``EMQNOJOB`` ...). :func:`from_reply` is the one place that maps those codes onto this tree;
an error reply without a known code becomes :class:`ServerError`.
"""

from __future__ import annotations

import sys
from typing import Any


class EchoMQError(Exception):
    """Root of every error EchoMQ raises on purpose."""


class ConfigurationError(EchoMQError, ValueError):
    """Raised when a connection URL, an option or a setting is malformed or unknown, or when a
    data frame is asked of a library that is not installed (the message names the extra)."""


class ServerStartError(EchoMQError):
    """Raised when no server binary is found, or an embedded server or cluster does not come
    up in time. The message carries the tail of the server's log, where the reason is."""


class ConnectionLost(EchoMQError):
    """Raised when the server cannot be reached or the connection dropped mid-call.

    The call may or may not have taken effect; every EchoMQ write is safe to retry by id.
    """


class ServerError(EchoMQError):
    """Raised when the server answers with an error EchoMQ does not know (or a malformed reply)."""


class ServerFull(ServerError):
    """Raised when the server refused a write because its memory reached ``maxmemory`` (under
    ``noeviction``, the setting EchoMQ asks for; the reply starts ``OOM``).

    Nothing of the refused call was written: every script declares its flags (a ``#!lua``
    first line), and a full server refuses one that may grow memory before it runs, so a script
    call is written whole or not at all (docs/RELIABILITY.md lists the few that still run on a
    full server: readers, and those that only free memory). A completion or failure of at most
    500 jobs is one call: raised, none of it was recorded. A call of more that was cut between
    its calls raises :class:`PartlyWritten`, which says what was. An add cut by it (a bulk
    add of more than 500 jobs, a flow's levels, a new queue's registration sent with it)
    keeps what its earlier calls wrote: the same add retried (same ids) completes it. The
    Pump's promote and recovery passes raise it only when every queue's call was refused
    (otherwise they report what ran and leave the rest for the next pass). Retry once memory
    is freed (a retention sweep, a bigger ``maxmemory``); workers keep their results and
    record them then."""


class PartlyWritten(ServerFull):
    """Raised by a completion or failure of more than 500 jobs (one script call per 500, sent
    in one round trip) when a full server refused some of its calls after others ran.

    ``written`` holds the items whose calls were written, as the calls carried them - a
    completion's ``(job, serialised result)`` pairs, a failure's ``(job, error, traceback,
    delay_ms)`` records - in the order given, ``settled`` what those calls did (a
    :class:`~echomq_core.models.Settlement`, a status per item of ``written``), ``refused``
    the items of the refused calls: nothing of them was written, so they can be sent again
    once memory is freed (their leases are still theirs). A :class:`ServerFull`, so code that
    retries a refused call retries this too - it must then send only ``refused``: the others
    would come back as lost leases."""

    def __init__(self, message: str, written: list[Any], settled: Any, refused: list[Any]) -> None:
        super().__init__(message)
        self.written = written
        self.settled = settled
        self.refused = refused


class InvalidInput(EchoMQError, ValueError):
    """Raised when an argument is refused; nothing was written."""


class InvalidQueueName(InvalidInput):
    """Raised when a queue name is empty, too long, not a string, or could break the hash tag
    or the key grammar (braces, colons, whitespace, control characters)."""


class InvalidJobId(InvalidInput):
    """Raised when a job id is not ``JOB-`` plus a safe tail (no braces, whitespace, control
    characters; bounded length). Script code ``EMQKIND``."""


class InvalidPayload(InvalidInput):
    """Raised when a payload or result cannot be serialised, or is larger than the limit."""


class InvalidFlow(InvalidInput):
    """Raised when a flow is malformed: no children, duplicate child ids, a child with its
    parent's id, a cycle, or an unknown failure policy."""


class InvalidArgument(InvalidInput):
    """Raised when a numeric or option argument is out of range (batch sizes, timeouts,
    attempts, delays)."""


class QueueInUse(EchoMQError):
    """Raised when a queue's shard count is changed (``EchoMQ.set_shards``, ``echomq queue
    config --shards``) while one of its shards holds jobs, flows or outbox signals; nothing
    was written. Jobs keep the shard their id chose, so the count changes only while empty."""


class JobNotFound(EchoMQError):
    """Raised when a job id names no job in that queue (``get_job``), or no flow
    (``close_flow``, ``cancel_flow``, ``retry_flow``: script code ``EMQNOJOB``)."""


class LeaseLost(EchoMQError):
    """Raised when a completion, failure or heartbeat presents a token that is not the job's
    current lease (the lease expired and the job was recovered or re-claimed). The call changed
    nothing. Raised by the host: the scripts answer a stale token with a status, not an error
    (a batch may hold current and stale tokens at once) - except ``job.spawn(..., own=True)``
    from a handler whose job's lease is gone (script code ``EMQLEASE``): nothing spawned."""


class FlowConflict(EchoMQError):
    """Raised when a flow add names a parent that exists with a different number of children,
    or an id that is already used by a job of another shape. Script code ``EMQFLOW``."""

    #: The id that is taken by another flow or a plain job (script code ``EMQTAKEN``), if that
    #: is the conflict.
    taken: str | None = None
    #: The generation a replaced parent holds (script code ``EMQGEN``): the host re-plans.
    generation: str | None = None


class ParentFailed(EchoMQError):
    """Raised by waits (sensors, IO managers) when the flow's parent failed because a
    fail-the-parent child died. ``failed`` maps each such child id to its error."""

    def __init__(self, queue: str, parent_id: str, failed: dict[str, str]) -> None:
        self.queue = queue
        self.parent_id = parent_id
        self.failed = dict(failed)
        names = ", ".join(f"{k}: {v}" for k, v in sorted(self.failed.items())[:5])
        more = "" if len(self.failed) <= 5 else f" (+{len(self.failed) - 5} more)"
        super().__init__(
            f"flow parent {parent_id!r} in queue {queue!r} failed; "
            f"failed children: {names or 'none recorded'}{more}"
        )


class FlowCancelled(ParentFailed):
    """Raised by waits when the flow was cancelled (``cancel_flow``): it will never be
    released. A :class:`ParentFailed`, so code that handles a failed flow handles this too;
    ``reason`` is the reason given to the cancel."""

    def __init__(
        self, queue: str, parent_id: str, reason: str, failed: dict[str, str] | None = None
    ) -> None:
        super().__init__(queue, parent_id, failed or {})
        self.reason = reason
        self.args = (
            f"flow parent {parent_id!r} in queue {queue!r} was cancelled: "
            f"{reason or 'no reason given'}",
        )


class FlowTimeout(EchoMQError):
    """Raised by bounded waits when a flow's parent is not released in time."""


class Unrecoverable(EchoMQError):
    """Raise from a handler to bury the job now, without its remaining attempts (the error
    is deterministic: retrying cannot help). Its parent is then settled by its policy."""


# Script error codes -> exception classes. The codes are the first word of the error reply.
_CODES: dict[str, type[EchoMQError]] = {
    "EMQKIND": InvalidJobId,
    "EMQNOJOB": JobNotFound,
    "EMQFLOW": FlowConflict,
    "EMQARG": InvalidArgument,
    "EMQLEASE": LeaseLost,
}


def from_reply(message: str) -> EchoMQError:
    """Map a server error reply (``"EMQKIND job id ..."``) onto the exception tree.
    ``EMQTAKEN <id> ...`` and ``EMQGEN <n> ...`` are :class:`FlowConflict` carrying the id
    (``.taken``) or the generation (``.generation``) as a field, not as prose to parse."""
    text = message.strip()
    code = text.split(" ", 1)[0]
    if code in ("EMQTAKEN", "EMQGEN"):
        _, subject, rest = [*text.split(" ", 2), "", ""][:3]
        conflict = FlowConflict(rest or subject)
        if code == "EMQTAKEN":
            conflict.taken = subject
        else:
            conflict.generation = "" if subject == "0" else subject
        return conflict
    cls = _CODES.get(code)
    if cls is None:
        if code == "OOM" or "used memory > 'maxmemory'" in text:
            return ServerFull(text)  # redis-py's OutOfMemoryError drops the "OOM" word
        return ServerError(text)
    return cls(text[len(code) :].strip() or code)


def flow_error(
    queue: str, parent_id: str, outcome: str, failed: dict[str, str], reason: str | None = None
) -> ParentFailed:
    """The error a wait raises for a flow that will never be released (``outcome`` 'failed' or
    'cancelled', as :attr:`FlowSnapshot.outcome <echomq_core.FlowSnapshot.outcome>` says)."""
    if outcome == "cancelled":
        return FlowCancelled(queue, parent_id, reason or "", failed)
    return ParentFailed(queue, parent_id, failed)


def is_redis_error(exc: BaseException) -> bool:
    """Whether ``exc`` is one of redis-py's own errors (``redis.RedisError``), which a caller
    outside the drivers (the CLI, the embedded server's probes) explains as a failure of the
    server or the network rather than a bug. redis-py is imported with the first client, so
    while it was never imported nothing could have raised one: this does not import it."""
    redis = sys.modules.get("redis")
    error = getattr(redis, "RedisError", None)
    return isinstance(error, type) and isinstance(exc, error)
