"""What an integration builds on beside the client's methods: the Airflow provider and the
Dagster integration import these (and ``echomq_core``'s public names) and nothing else of the
core, so that an integration - those two, or one of your own - decides nothing twice: the
kinds of a wait's verdict, the argument checks and id rules, the bounds of the reads, the
frames of a flow's results, the Pump's settings, the dashboard's paths. Documented in the API
reference ("For integrations"); the import-linter contract in ``pyproject.toml`` keeps the
adapters to this door."""

from __future__ import annotations

from .checks import check_int, check_seconds
from .control.options import PumpOptions
from .control.options import describe as describe_option
from .flows.children import MAX_RANGE
from .flows.failures import SHOWN_TRACEBACK, traceback_tail
from .flows.frames import library as frame_library
from .flows.frames import results_frame
from .flows.release_watch import MAX_TAKE, check_watcher
from .flows.streaming import MAX_PAGE as MAX_FOLLOW_PAGE
from .flows.waiting import (
    CANCELLED,
    CLOSED,
    FAILED,
    FAST_POLL,
    MISSING,
    RELEASED,
    STALLED,
    TIMED_OUT,
    WAITING,
    kind_of,
)
from .queues.adding import gc_paused
from .seeing.urls import flow_page
from .wire.collector import paused as collector_paused
from .wire.keyspace import (
    MAX_ID_LENGTH,
    check_group,
    check_job_id,
    check_queue,
    derived_index,
    id_part,
)

__all__ = [
    "CANCELLED",
    "CLOSED",
    "FAILED",
    "FAST_POLL",
    "MAX_FOLLOW_PAGE",
    "MAX_ID_LENGTH",
    "MAX_RANGE",
    "MAX_TAKE",
    "MISSING",
    "RELEASED",
    "SHOWN_TRACEBACK",
    "STALLED",
    "TIMED_OUT",
    "WAITING",
    "PumpOptions",
    "check_group",
    "check_int",
    "check_job_id",
    "check_queue",
    "check_seconds",
    "check_watcher",
    "collector_paused",
    "derived_index",
    "describe_option",
    "flow_page",
    "frame_library",
    "gc_paused",
    "id_part",
    "kind_of",
    "results_frame",
    "traceback_tail",
]
