"""The dashboard's pages for one job, a queue's jobs by state and a flow's children, and the
job page's two actions (retry a dead job, cancel a pending or delayed one).

========================================  ==============================================
``GET /job/<queue>/<id>``                 one job (``/api/job/...``): state, payload, result
                                          or error and traceback, attempts, times, lease,
                                          parent and flow; its children when it is a parent
``GET /queue/<queue>?state=&offset=&find=``  a queue's jobs in one state, paged in server
  ``&minutes=``                           order (``/api/queue/...``); ``find``: to a job;
                                          ``minutes``: the chart's range (60, 360, 1440)
``GET /flow/<queue>/<id>/children``       the flow's children in spec order, ``?show=`` all |
  ``?show=&offset=&find=&q=&cursor=``     completed | failed | ignored | pending, ``find`` by
                                          id, ``q``: failed children by error text
                                          (``/api/flow/.../children``)
``POST /job/<queue>/<id>/retry|cancel``   behind the guard (:mod:`.security`)
========================================  ==============================================

What each read costs: :mod:`echomq_core.seeing.browse` and :mod:`echomq_core.flows.children`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from ..client.clients import EchoMQ
from ..errors import InvalidArgument, JobNotFound
from ..flows.children import children_page, search_failed
from ..flows.sharding import shard_of
from ..seeing.browse import PAGE, SHOWS, STATES, QueuePage, job_detail
from ..seeing.urls import FLOW_PATH, JOB_PATH, flow_page, job_page
from ..wire.keyspace import check_job_id, check_queue
from . import reads
from .monitoring import RANGES
from .params import flow_names, int_param
from .shards import page_over

#: What may follow a job's names in a POST's path.
JOB_ACTIONS = ("retry", "cancel")


def _param(request: Request, name: str, choices: tuple[str, ...], default: str) -> str:
    value = request.query_params.get(name) or default
    if value not in choices:
        raise InvalidArgument(f"{name} must be one of {', '.join(choices)}, got {value!r:.40}")
    return value


def _find(request: Request) -> str | None:
    raw = (request.query_params.get("find") or "").strip()
    return check_job_id(raw) if raw else None


class Browsing:
    """The pages above, as methods of :class:`~.app.Dashboard` (which defines what is only
    declared here)."""

    client: EchoMQ

    def render(self, request: Request, name: str, status: int = 200, **ctx: Any) -> HTMLResponse:
        raise NotImplementedError

    def throughput(self, queue: str, minutes: int = 60) -> dict[str, Any]:
        raise NotImplementedError  # :class:`~.monitoring.Monitoring`

    async def _guarded(
        self, request: Request, action: Callable[[dict[str, str]], tuple[str, dict[str, Any]]]
    ) -> Response:
        raise NotImplementedError

    # -- one job ---------------------------------------------------------------------------
    def _job(self, request: Request, under: str) -> reads.JobView:
        queue, job_id, _ = flow_names(request, under)
        shard = shard_of(self.client.shards(queue), job_id)  # a sharded queue: the id's shard
        found = self.client.perform(
            job_detail(self.client.keys, shard, job_id, self.client.serializer)
        )
        if found is None:
            raise JobNotFound(f"no job {job_id} in queue {queue!r} (never added, or expired)")
        return reads.job_view(self.client, found)

    def job(self, request: Request) -> Response:
        view = self._job(request, JOB_PATH)
        now = self.client.perform(reads.server_ms()) if view.detail.lease else None
        return self.render(
            request, "job.html", v=view, j=view.detail.info, d=view.detail, now_ms=now
        )

    def api_job(self, request: Request) -> Response:
        view = self._job(request, "/api" + JOB_PATH)
        root = None if view.root is None else list(view.root)
        doc = {**view.detail.to_dict(), "root": root, "attempts_made": view.attempts_made}
        if view.value_found:  # a completed flow child: its value, read from its flow
            doc["result"] = reads.jsonable(view.value)
        return JSONResponse(doc)

    async def job_action(self, request: Request) -> Response:
        """``POST /job/<queue>/<id>/retry|cancel``: a dead plain job gets fresh attempts, a
        pending or delayed one goes to the morgue (``Queue.cancel``); anything else is left
        as it is and said so (a flow's child: repair or cancel its flow)."""
        queue, job_id, tail = flow_names(request, JOB_PATH, JOB_ACTIONS)
        if not tail:
            raise JobNotFound(f"no action at {request.url.path}: POST to .../retry|cancel")
        back = job_page("", queue, job_id).lstrip("/")
        q = self.client.queue(queue)

        def act(form: dict[str, str]) -> tuple[str, dict[str, Any]]:
            if tail == "retry":
                n, left = q.retry_dead([job_id])
                done = (
                    f"{job_id} queued again"
                    if n
                    else f"{job_id} left as it is (not a dead plain job)"
                )
                return back, {"revived": n, "left": left, "done": done}
            n, left = q.cancel([job_id], reason=form.get("reason", "")[:500])
            done = (
                f"{job_id} cancelled" if n else f"{job_id} left as it is (not a pending plain job)"
            )
            return back, {"cancelled": n, "left": left, "done": done}

        return await self._guarded(request, act)

    # -- a queue by state ------------------------------------------------------------------
    def _queue_args(self, request: Request) -> tuple[str, str, int]:
        queue = check_queue(request.path_params["queue"])
        state = _param(request, "state", STATES, "pending")
        return queue, state, int_param(request, "offset", 0, 10_000_000)

    def _page(self, queue: str, state: str, offset: int) -> QueuePage:
        """A page of ``queue`` in ``state``: over every shard of a sharded queue."""
        shards = self.client.shards(queue)
        return self.client.perform(page_over(self.client.keys, shards, state, offset))

    def queue_jobs(self, request: Request) -> Response:
        queue, state, offset = self._queue_args(request)
        find = _find(request)
        if find is not None:
            base = request.scope.get("root_path", "").rstrip("/")
            return RedirectResponse(job_page(base, queue, find), 303)
        ranges = tuple(str(m) for m, _ in RANGES)
        minutes = int(_param(request, "minutes", ranges, ranges[0]))
        counts = self.client.queue(queue).stats()
        if "state" not in request.query_params and not counts.get(state):
            # opened without a tab: the first state that holds jobs, not an empty pending list
            state = next((st for st in STATES if counts.get(st)), state)
        found = self._page(queue, state, offset)
        now = self.client.perform(reads.server_ms()) if state == "active" else None
        return self.render(
            request,
            "queue.html",
            found=found,
            counts=counts,
            job_states=STATES,
            page=PAGE,
            t=self.throughput(queue, minutes),
            minutes=minutes,
            ranges=RANGES,
            now_ms=now,
            live=f"api/throughput/{quote(queue, safe='')}?minutes={minutes}&chart=1",
            groups=self.client.group_load(queue),
        )

    def api_queue_jobs(self, request: Request) -> Response:
        queue, state, offset = self._queue_args(request)
        doc = self._page(queue, state, offset).to_dict()
        now = self.client.perform(reads.server_ms()) if state == "active" else None
        for row in doc["jobs"]:
            row["attempts_made"] = reads.attempts_made(state, row["attempts"])
            if now is not None:  # an active row's score is its lease deadline
                row["lease_expired"] = row["score"] < now
        return JSONResponse(doc)

    # -- a flow's children -----------------------------------------------------------------
    def _children(self, request: Request, queue: str, pid: str) -> dict[str, Any]:
        """What the children page shows: a page of children, or the search's matches."""
        show = _param(request, "show", SHOWS, "all")
        offset = int_param(request, "offset", 0, 2**40)
        text = (request.query_params.get("q") or "").strip()
        mq = self.client
        op = children_page(
            mq.keys, queue, pid, mq.serializer, show=show, offset=offset, find=_find(request)
        )
        found = mq.perform(op)
        if found is None:
            raise JobNotFound(f"no flow {pid} in queue {queue!r} (never added, or expired)")
        out: dict[str, Any] = {"c": found, "q": text, "matches": None, "more": ""}
        if text:
            cursor = request.query_params.get("cursor", "")
            rows, more = mq.perform(search_failed(mq.keys, queue, pid, text, mq.serializer, cursor))
            out.update(matches=rows, more=more)
        return out

    def children(self, request: Request, queue: str, pid: str) -> Response:
        return self.render(
            request, "children.html", shows=SHOWS, **self._children(request, queue, pid)
        )

    def api_children(self, request: Request, queue: str, pid: str) -> Response:
        got = self._children(request, queue, pid)
        doc = got["c"].to_dict()
        if got["matches"] is not None:
            doc["matches"] = [r.to_dict() for r in got["matches"]]
            doc["more"] = got["more"]
        return JSONResponse(doc)


__all__ = ["FLOW_PATH", "JOB_ACTIONS", "Browsing", "flow_page"]
