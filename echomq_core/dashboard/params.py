"""What the dashboard's handlers read from a request: the names in a path (queue and id, which
may hold ``/``) and bounded integer parameters - one home for the app and its page mixins."""

from __future__ import annotations

from urllib.parse import quote

from starlette.requests import Request

from ..errors import InvalidArgument
from ..seeing.urls import split_flow_path
from ..wire.keyspace import check_job_id, check_queue


def flow_names(request: Request, under: str, tails: tuple[str, ...] = ()) -> tuple[str, str, str]:
    """The checked ``(queue, parent id, tail)`` of a request to ``under`` + ``<queue>/<id>``.

    Read from the path as the client sent it (the ASGI ``raw_path``: ``%2F`` still quoted),
    since the decoded path cannot tell a ``/`` inside a name from one between names; when the
    server gives no raw path, or the mount's prefix is spelled otherwise in it, the decoded
    path is split instead (see :func:`echomq_core.seeing.urls.split_flow_path`)."""
    root = request.scope.get("root_path", "")
    rest = request.path_params["rest"]
    raw = request.scope.get("raw_path")
    if isinstance(raw, bytes):
        sent = raw.decode("latin-1")
        for prefix in (root + under, quote(root) + under):
            if sent.startswith(prefix):
                rest = sent[len(prefix) :]
                break
    queue, pid, tail = split_flow_path(rest, tails)
    return check_queue(queue), check_job_id(pid), tail


def int_param(request: Request, name: str, low: int, high: int) -> int:
    raw = request.query_params.get(name, "") or str(low)
    try:
        value = int(raw)
    except ValueError:
        raise InvalidArgument(f"{name} must be an integer, got {raw[:40]!r}") from None
    if not low <= value <= high:
        raise InvalidArgument(f"{name} must be {low} to {high}, got {value}")
    return value
