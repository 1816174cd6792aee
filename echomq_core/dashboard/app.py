"""The dashboard's ASGI app (Starlette): server-rendered pages, a little plain JavaScript that
polls the JSON twins of the pages for live progress, ``/metrics`` for Prometheus, and - only
with actions on and a token - the POSTs that cancel, repair and close flows and replay poison.

Pages (every link is relative to where the app is mounted, so the same app runs on its own
under ``echomq dashboard`` and inside Airflow's api-server under ``/echomq``):

========================================  ==============================================
``GET /``                                 queues at a glance (``/api/queues``)
``GET /flows?queue=&state=&offset=``      root flows by state with progress (``/api/flows``)
``GET /flow/<queue>/<parent id>``         a flow: tree, counts, failed and ignored children,
                                          values paged by ``?cursor=`` (``/api/flow/...``: the
                                          snapshot only, one command per poll; ``.../values``)
``GET /dead/<queue>?offset=``             dead jobs, newest first, each with its flow to repair
``GET /poison/<queue>``                   poisoned signals with their reasons
``GET /job/...``, ``/queue/...``,         one job, a queue's jobs by state, a flow's children
``/flow/.../children``                    in spec order: see :mod:`.browsing`
``GET /workers``, ``/api/throughput/...``  live workers, a queue's minutes: :mod:`.monitoring`
``GET /metrics``                          Prometheus text format (:mod:`echomq_core.seeing.metrics`)
``POST /flow/<queue>/<id>/cancel|retry|close``, ``POST /poison/<queue>/replay``, ``POST /login``,
``POST /logout``, ``POST /job/<queue>/<id>/retry|cancel``: see :mod:`.security` for who may.
========================================  ==============================================

Names in a path are quoted whole (:func:`echomq_core.seeing.urls.flow_page`): queue names and ids
may hold ``/`` (Airflow's parent ids always do) and ids ``#``. A flow's two names are split from
the path as the client sent it (:func:`flow_names`); the other pages carry one name, which
takes the rest of the path.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypedDict, Unpack
from urllib.parse import parse_qs, quote, urlencode

import jinja2
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ..client.clients import EchoMQ
from ..errors import EchoMQError, InvalidArgument, InvalidInput, JobNotFound
from ..flows import sharding
from ..pump.drain import poison_replay
from ..seeing.metrics import QueueCollector
from ..seeing.urls import FLOW_PATH, JOB_PATH, QUEUE_PATH, flow_page, job_page, queue_page
from ..wire.keyspace import FLOW_INDEXES, FLOW_LISTS, check_job_id, check_queue
from . import reads
from .browsing import Browsing
from .monitoring import Monitoring
from .params import flow_names, int_param
from .security import CSRF_FIELD, SESSION_COOKIE, Guard, SecurityHeaders
from .shards import oldest_over

log = logging.getLogger(__name__)
HERE = Path(__file__).resolve().parent

#: A flow's JSON twin, and what may follow the flow's names in its path and in a POST's.
API_FLOW_PATH = "/api" + FLOW_PATH
API_TAILS = ("values", "children")
#: What may follow a flow's names in a GET of its page.
PAGE_TAILS = ("children",)
ACTIONS = ("cancel", "retry", "close")


class Dashboard(Monitoring, Browsing):
    """The app's state: the client, the guard, the templates and the server-side collector
    (shared by the overview and ``/metrics``, so both see the same outbox-head ages).
    ``pending_alert``: the age in seconds past which a queue's oldest pending job is
    highlighted on the overview."""

    def __init__(
        self,
        client: EchoMQ,
        *,
        actions: bool = False,
        token: str | None = None,
        poll: float = 2.0,
        title: str = "EchoMQ",
        pending_alert: float = 300.0,
    ) -> None:
        if not 0.2 <= poll <= 3600:
            raise InvalidArgument(f"poll must be 0.2 to 3600 seconds, got {poll!r}")
        if not 0 < pending_alert <= 30 * 86400:
            raise InvalidArgument(
                f"pending_alert must be 0 to 30 days in seconds, got {pending_alert!r}"
            )
        self.pending_alert = pending_alert
        self.client = client
        self.guard = Guard(actions, token)
        self.poll = poll
        self.title = title
        self.collector = QueueCollector(client)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.collector)
        self.env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(HERE / "templates"),
            autoescape=jinja2.select_autoescape(["html"]),
            undefined=jinja2.StrictUndefined,
        )
        self.env.filters["ago"] = _ago
        self.env.filters["when"] = _when
        # JSON for reading (tojson's \u003c escapes are for <script>; this is text, escaped
        # as all text is)
        self.env.filters["shown"] = lambda v, indent=None: json.dumps(
            v, indent=indent, ensure_ascii=False, default=repr
        )
        self.env.filters["q"] = lambda s: quote(str(s), safe="")
        self.env.filters["outstanding"] = reads.outstanding
        self.env.globals["made"] = reads.attempts_made

    # -- rendering -------------------------------------------------------------------------
    def render(self, request: Request, name: str, status: int = 200, **ctx: Any) -> HTMLResponse:
        sid = self.guard.session_id(request.cookies.get(SESSION_COOKIE))
        base = request.scope.get("root_path", "").rstrip("/")
        page = self.env.get_template(name).render(
            **{"live": "", **ctx},
            base=base,
            flow_url=lambda queue, pid, tail="": flow_page(base, queue, pid, tail),
            job_url=lambda queue, job_id, tail="": job_page(base, queue, job_id, tail),
            queue_url=lambda queue: queue_page(base, queue),
            title=self.title,
            poll_ms=int(self.poll * 1000),
            actions=self.guard.enabled,
            signed_in=sid is not None,
            csrf=self.guard.csrf_for(sid) if sid else "",
            csrf_field=CSRF_FIELD,
            states=FLOW_INDEXES,
            flow_lists=FLOW_LISTS,
            notice=request.query_params.get("done", ""),
        )
        return HTMLResponse(page, status_code=status)

    # -- reads -----------------------------------------------------------------------------
    def _readings(self) -> tuple[list[Any], dict[str, float | None]]:
        """The collector's readings and each queue's oldest pending age (two round trips more,
        :func:`echomq_core.seeing.browse.oldest_pending`)."""
        readings = self.collector.read()
        mq = self.client
        names = [r.queue for r in readings]  # logical names: a sharded queue's oldest shard head
        shards = mq.perform(sharding.resolve(mq.keys, mq.shard_cache, names))
        ages = mq.perform(oldest_over(mq.keys, {q: shards[q] for q in names}))
        return readings, ages

    def overview(self, request: Request) -> Response:
        started = time.perf_counter()
        readings, ages = self._readings()
        return self.render(
            request,
            "queues.html",
            readings=readings,
            ages=ages,
            alert_after=self.pending_alert,
            live="api/queues",
            took=time.perf_counter() - started,
        )

    def api_queues(self, request: Request) -> Response:
        readings, ages = self._readings()
        queues = {
            r.queue: {**r.to_dict(), "oldest_pending_age": ages.get(r.queue)} for r in readings
        }
        return JSONResponse({"queues": queues, "pending_alert": self.pending_alert})

    def _flow_args(self, request: Request) -> tuple[str | None, str | None, int]:
        queue = request.query_params.get("queue") or None
        state = request.query_params.get("state") or None
        if state is not None and state not in FLOW_LISTS:
            raise InvalidArgument(f"state must be one of {', '.join(FLOW_LISTS)}, got {state!r}")
        return queue, state, int_param(request, "offset", 0, 10_000_000)

    def flows(self, request: Request) -> Response:
        queue, state, offset = self._flow_args(request)
        found = reads.list_flows(self.client, queue, state, offset)
        query = {k: v for k, v in (("queue", queue), ("state", state)) if v}
        return self.render(
            request,
            "flows.html",
            found=found,
            queue=queue or "",
            state=state or "",
            offset=offset,
            page=reads.PAGE,
            live="api/flows?" + urlencode({**query, "offset": offset}),
        )

    def api_flows(self, request: Request) -> Response:
        queue, state, offset = self._flow_args(request)
        found = reads.list_flows(self.client, queue, state, offset)
        flows: dict[str, dict[str, Any]] = {}
        for f in found.flows:
            flows.setdefault(f.queue, {})[f.parent_id] = f.to_dict()
        return JSONResponse({"counts": found.counts, "flows": flows})

    def _flow(self, queue: str, pid: str, request: Request) -> reads.FlowPage:
        cursor = int_param(request, "cursor", 0, 2**63)
        found = reads.flow_page(self.client, queue, pid, cursor)
        if found is None:
            raise JobNotFound(f"no flow {pid} in queue {queue!r} (never added, or expired)")
        return found

    def flow(self, request: Request) -> Response:
        queue, pid, tail = flow_names(request, FLOW_PATH, PAGE_TAILS)
        if tail == "children":
            return self.children(request, queue, pid)
        found = self._flow(queue, pid, request)
        s = found.tree.snap
        return self.render(
            request,
            "flow.html",
            f=found,
            s=s,
            cursor=int_param(request, "cursor", 0, 2**63),
            live=flow_page("api", s.queue, s.parent_id),
        )

    def api_flow(self, request: Request) -> Response:
        """``/api/flow/<queue>/<id>``: the snapshot; ``.../values``: a page of values."""
        queue, pid, tail = flow_names(request, API_FLOW_PATH, API_TAILS)
        if tail == "children":
            return self.api_children(request, queue, pid)
        if tail == "values":
            cursor = int_param(request, "cursor", 0, 2**63)
            next_cursor, values = reads.values_page(self.client, queue, pid, cursor)
            shown = {k: reads.jsonable(v) for k, v in values.items()}
            return JSONResponse({"values": shown, "cursor": next_cursor})
        found = reads.flow_status(self.client, queue, pid)
        if found is None:
            raise JobNotFound(f"no flow {pid} in queue {queue!r} (never added, or expired)")
        return JSONResponse(found)

    def dead(self, request: Request) -> Response:
        queue = check_queue(request.path_params["queue"])
        offset = int_param(request, "offset", 0, 10_000_000)
        found = reads.dead_jobs(self.client, queue, offset)
        return self.render(
            request, "dead.html", found=found, queue=queue, offset=offset, page=reads.PAGE
        )

    def poison(self, request: Request) -> Response:
        queue = check_queue(request.path_params["queue"])
        rows = reads.poisoned(self.client, queue)
        total = self.client.queue(queue).stats()["poison"]
        return self.render(request, "poison.html", rows=rows, queue=queue, total=total)

    def metrics(self, request: Request) -> Response:
        return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)

    # -- writes ----------------------------------------------------------------------------
    async def _guarded(
        self, request: Request, action: Callable[[dict[str, str]], tuple[str, dict[str, Any]]]
    ) -> Response:
        """Run ``action(form)`` (in a thread) if the guard lets this POST through; browsers
        are redirected back with a notice, API callers (a bearer token) get JSON."""
        form = await _form(request)
        why = self.guard.refuse(
            authorization=request.headers.get("authorization"),
            cookie=request.cookies.get(SESSION_COOKIE),
            csrf=form.get(CSRF_FIELD),
            origin=request.headers.get("origin"),
            host=request.headers.get("host"),
        )
        if why is not None:
            log.warning("dashboard: refused %s %s: %s", request.method, request.url.path, why)
            return JSONResponse({"error": why}, status_code=403)
        back, result = await run_in_threadpool(action, form)
        if "authorization" in request.headers:
            return JSONResponse(result)
        base = request.scope.get("root_path", "").rstrip("/")
        sep = "&" if "?" in back else "?"
        return RedirectResponse(f"{base}/{back}{sep}done={quote(result['done'])}", 303)

    async def flow_action(self, request: Request) -> Response:
        """``POST /flow/<queue>/<id>/cancel|retry|close``."""
        queue, pid, tail = flow_names(request, FLOW_PATH, ACTIONS)
        if not tail:
            raise JobNotFound(f"no action at {request.url.path}: POST to .../cancel|retry|close")
        back = flow_page("", queue, pid).lstrip("/")
        mq = self.client

        def act(form: dict[str, str]) -> tuple[str, dict[str, Any]]:
            if tail == "cancel":
                c = mq.cancel_flow(queue, pid, reason=form.get("reason", "")[:500])
                done = f"{c.state}: {c.children} children stopped"
                return back, {"state": c.state, "children": c.children, "done": done}
            if tail == "retry":
                r = mq.retry_flow(queue, pid, ignored=form.get("ignored") == "1")
                done = f"{r.state}: {r.requeued} children back to work (repair #{r.repairs})"
                return back, {"state": r.state, "requeued": r.requeued, "done": done}
            state = mq.close_flow(queue, pid)
            return back, {"state": state, "done": state}

        return await self._guarded(request, act)

    async def retry_dead(self, request: Request) -> Response:
        queue = check_queue(request.path_params["queue"])

        def act(form: dict[str, str]) -> tuple[str, dict[str, Any]]:
            job_id = check_job_id(form.get("job_id", ""))
            revived, left = self.client.queue(queue).retry_dead([job_id])
            done = f"{job_id} queued again" if revived else f"{job_id} left as it is"
            back = f"dead/{quote(queue, safe='')}"
            return back, {"revived": revived, "left": left, "done": done}

        return await self._guarded(request, act)

    async def replay(self, request: Request) -> Response:
        queue = check_queue(request.path_params["queue"])

        def act(form: dict[str, str]) -> tuple[str, dict[str, Any]]:
            count = self.client.queue(queue).stats()["poison"]
            replay = poison_replay(self.client.keys, queue, count)
            moved = self.client.perform(replay) if count else 0
            back = f"poison/{quote(queue, safe='')}"
            return back, {"replayed": moved, "done": f"{moved} replayed"}

        return await self._guarded(request, act)

    async def login(self, request: Request) -> Response:
        if request.method == "GET":
            return self.render(request, "login.html", error="")
        form = await _form(request)
        if not self.guard.token_ok(form.get("token")):
            return self.render(request, "login.html", status=403, error="wrong token")
        base = request.scope.get("root_path", "").rstrip("/")
        response = RedirectResponse(f"{base}/", 303)
        response.set_cookie(
            SESSION_COOKIE,
            self.guard.new_session(),
            httponly=True,
            samesite="strict",
            path=base or "/",
        )
        return response

    async def logout(self, request: Request) -> Response:
        base = request.scope.get("root_path", "").rstrip("/")
        response = RedirectResponse(f"{base}/", 303)
        response.delete_cookie(SESSION_COOKIE, path=base or "/")
        return response

    # -- errors ----------------------------------------------------------------------------
    def error_page(self, request: Request, exc: Exception) -> Response:
        if isinstance(exc, JobNotFound):
            status = 404
        elif isinstance(exc, InvalidInput):
            status = 400
        elif not isinstance(exc, EchoMQError):
            status = 500
        else:
            status = 503  # the server is unreachable or answered with an error
            log.warning("dashboard: %s: %s", request.url.path, exc)
        if request.url.path.startswith(f"{request.scope.get('root_path', '')}/api/"):
            return JSONResponse({"error": str(exc), "type": type(exc).__name__}, status)
        return self.render(
            request, "error.html", status=status, error=str(exc), kind=type(exc).__name__
        )


class Settings(TypedDict, total=False):
    """What :func:`create_app` passes on to :class:`Dashboard` (its defaults are there)."""

    actions: bool
    token: str | None
    poll: float
    title: str
    pending_alert: float


def create_app(client: EchoMQ, **settings: Unpack[Settings]) -> Starlette:
    """The dashboard for ``client``'s keyspace. Read-only unless ``actions`` and ``token``
    (:class:`~echomq_core.errors.ConfigurationError` for actions without a token); ``poll``:
    seconds between the pages' live updates; ``pending_alert``: seconds past which a queue's
    oldest pending job is highlighted."""
    d = Dashboard(client, **settings)

    def sync(fn: Callable[[Request], Response]) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            try:
                return await run_in_threadpool(fn, request)
            except EchoMQError as exc:
                return d.error_page(request, exc)
            except Exception as exc:  # a bug: logged with its traceback, shown as one line
                log.exception("dashboard: %s failed", request.url.path)
                return d.error_page(request, exc)

        return endpoint

    def guarded(
        fn: Callable[[Request], Awaitable[Response]],
    ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            try:
                return await fn(request)
            except EchoMQError as exc:
                return d.error_page(request, exc)

        return endpoint

    flow = FLOW_PATH + "{rest:path}"
    routes = [
        Route("/", sync(d.overview)),
        Route("/flows", sync(d.flows)),
        Route(flow, sync(d.flow)),
        Route("/dead/{queue:path}", sync(d.dead)),
        Route("/poison/{queue:path}", sync(d.poison)),
        Route("/metrics", sync(d.metrics)),
        Route("/workers", sync(d.workers)),
        Route("/api/workers", sync(d.api_workers)),
        Route("/api/throughput/{queue:path}", sync(d.api_throughput)),
        Route("/api/queues", sync(d.api_queues)),
        Route("/api/flows", sync(d.api_flows)),
        Route(API_FLOW_PATH + "{rest:path}", sync(d.api_flow)),
        Route(JOB_PATH + "{rest:path}", sync(d.job)),
        Route("/api" + JOB_PATH + "{rest:path}", sync(d.api_job)),
        Route(QUEUE_PATH + "{queue:path}", sync(d.queue_jobs)),
        Route("/api" + QUEUE_PATH + "{queue:path}", sync(d.api_queue_jobs)),
        Route(JOB_PATH + "{rest:path}", guarded(d.job_action), methods=["POST"]),
        Route(flow, guarded(d.flow_action), methods=["POST"]),
        Route("/poison/{queue:path}/replay", guarded(d.replay), methods=["POST"]),
        Route("/dead/{queue:path}/retry", guarded(d.retry_dead), methods=["POST"]),
        Route("/login", guarded(d.login), methods=["GET", "POST"]),
        Route("/logout", guarded(d.logout), methods=["POST"]),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    app = Starlette(routes=routes)
    app.state.dashboard = d
    app.add_middleware(SecurityHeaders)
    return app


async def _form(request: Request) -> dict[str, str]:
    """An urlencoded form body (without python-multipart), or {} for anything else."""
    if request.method != "POST":
        return {}
    kind = request.headers.get("content-type", "").split(";")[0].strip()
    if kind != "application/x-www-form-urlencoded":
        return {}
    body = (await request.body())[:65536].decode(errors="replace")
    return {k: v[0] for k, v in parse_qs(body, keep_blank_values=True).items()}


def _when(ms: float | None) -> str:
    """A server timestamp (ms) as UTC time and how long ago, for a page."""
    if ms is None:
        return "-"
    import datetime

    at = datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)
    ago = time.time() - ms / 1000
    rel = f"{_ago(ago)} ago" if ago >= 0 else f"in {_ago(-ago)}"
    return f"{at:%Y-%m-%d %H:%M:%S}Z ({rel})"


def _ago(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = max(0.0, float(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{s / size:.1f}{unit}"
    return f"{s:.1f}s"
