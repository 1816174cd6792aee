"""The dashboard's time and workers views: a queue's completed jobs, failed attempts and
deaths per minute as an inline SVG chart (no JavaScript library) with its oldest pending job's
age as a gauge, on the queue page (over 1 h, 6 h or 24 h: :data:`RANGES`) and as JSON, and
the live worker processes. The queue page polls its chart's JSON with ``chart=1``, which adds
the chart's markup, so the chart refreshes the way every other live number does.

========================================  ==============================================
``GET /api/throughput/<queue>?minutes=``  the last 1-1440 minutes (default 60), oldest first
  ``&chart=1``                            (:func:`echomq_core.queues.throughput.read_minutes`: one
                                          round trip, one HGETALL of at most 1,440 fields);
                                          ``chart=1``: the SVG too
``GET /workers``, ``GET /api/workers``    live workers, newest beat first
                                          (:func:`echomq_core.queues.registry.read_workers`)
========================================  ==============================================
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from markupsafe import Markup
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response

from ..client.clients import EchoMQ
from ..queues.registry import read_workers
from ..queues.throughput import DAY, Minute
from ..wire.keyspace import check_queue
from .params import int_param
from .shards import minutes_over, oldest_over

#: The chart's size in SVG user units (it scales to the page's width).
WIDTH, HEIGHT, PAD = 720, 150, 28
#: The most width one character of a tick label takes (10 px system-ui digits and commas are
#: about 5.6): the left margin grows with the top label.
TICK_CHAR = 6.5
#: The queue page's ranges (minutes, label); the first is the default.
RANGES = ((60, "1 h"), (360, "6 h"), (1440, "24 h"))
#: The most bars a chart draws: longer ranges add up consecutive minutes per bar (24 h: four),
#: so the markup a live refresh sends stays bounded (a bar is under 0.5 KB).
MAX_BARS = 360


def bars(minutes: Sequence[Minute]) -> list[Minute]:
    """``minutes`` summed in runs of consecutive minutes, at most :data:`MAX_BARS` runs; each
    run is stamped with its first minute."""
    size = -(-len(minutes) // MAX_BARS) if minutes else 1
    if size == 1:
        return list(minutes)
    out = []
    for i in range(0, len(minutes), size):
        run = minutes[i : i + size]
        out.append(
            Minute(
                run[0].at,
                sum(m.completed for m in run),
                sum(m.failed for m in run),
                sum(m.deaths for m in run),
            )
        )
    return out


def chart(minutes: Sequence[Minute]) -> Markup:
    """Completed (below) and failed attempts (stacked on top, the deaths among them darker at
    their base) as bars of one or more minutes (:func:`bars`), the tallest bar's total on the
    axis, the first and last minute's UTC time under it. Only numbers and times go into the
    markup, so nothing needs escaping."""
    import datetime

    per = -(-len(minutes) // MAX_BARS) if minutes else 1
    span = f" ({per} min)" if per > 1 else ""
    minutes = bars(minutes)
    top = max([m.completed + m.failed for m in minutes] + [1])
    # the axis leaves room for the top label, which is drawn right-aligned left of it: a
    # fixed margin clipped a total of five digits or more (a busy 24 h bar) at the SVG's edge
    pad = max(PAD, round(TICK_CHAR * len(f"{top:,}")) + 8)
    n = max(1, len(minutes))
    step = (WIDTH - pad) / n
    inner = HEIGHT - 2 * 14
    parts = [
        f'<svg id="throughput-chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-label="completed, failed attempts and deaths per minute" data-bars="{n}" '
        f'data-per="{per}" xmlns="http://www.w3.org/2000/svg">',
        f'<line x1="{pad}" y1="{14 + inner}" x2="{WIDTH}" y2="{14 + inner}" class="axis"/>',
        f'<text x="{pad - 4}" y="18" text-anchor="end" class="tick" id="chart-top">{top:,}</text>',
        f'<text x="{pad - 4}" y="{14 + inner}" text-anchor="end" class="tick">0</text>',
    ]
    for i, m in enumerate(minutes):
        x = pad + i * step
        w = max(1.0, step - 1)
        hc = inner * m.completed / top
        hf = inner * m.failed / top
        hd = inner * min(m.deaths, m.failed) / top
        base = 14 + inner
        stamp = datetime.datetime.fromtimestamp(m.at / 1000, datetime.UTC).strftime("%H:%M")
        title = (
            f"<title>{stamp}Z{span}: {m.completed:,} completed, {m.failed:,} failed attempts, "
            f"{m.deaths:,} deaths</title>"
        )
        if m.completed:
            parts.append(
                f'<rect class="done" x="{x:.1f}" y="{base - hc:.1f}" width="{w:.1f}" '
                f'height="{hc:.1f}" data-n="{m.completed}">{title}</rect>'
            )
        if m.failed:
            parts.append(
                f'<rect class="failed" x="{x:.1f}" y="{base - hc - hf:.1f}" width="{w:.1f}" '
                f'height="{hf:.1f}" data-n="{m.failed}">{title}</rect>'
            )
        if m.deaths:
            parts.append(
                f'<rect class="deaths" x="{x:.1f}" y="{base - hc - hd:.1f}" width="{w:.1f}" '
                f'height="{hd:.1f}" data-n="{m.deaths}">{title}</rect>'
            )
    if minutes:
        for m, x, anchor in ((minutes[0], pad, "start"), (minutes[-1], WIDTH, "end")):
            at = datetime.datetime.fromtimestamp(m.at / 1000, datetime.UTC).strftime("%H:%M")
            parts.append(
                f'<text x="{x}" y="{HEIGHT - 2}" text-anchor="{anchor}" class="tick">{at}Z</text>'
            )
    parts.append("</svg>")
    return Markup("".join(parts))


class Monitoring:
    """The views above, as methods of :class:`~.app.Dashboard`."""

    client: EchoMQ
    pending_alert: float

    def render(self, request: Request, name: str, status: int = 200, **ctx: Any) -> HTMLResponse:
        raise NotImplementedError

    def _minutes(self, request: Request) -> int:
        return int_param(request, "minutes", 1, DAY) if "minutes" in request.query_params else 60

    def throughput(self, queue: str, minutes: int = 60) -> dict[str, Any]:
        """What the queue page's chart section shows: the minutes, their totals, the chart and
        the oldest pending job's age against the alert threshold."""
        ks = self.client.keys
        shards = self.client.shards(queue)  # a sharded queue: every shard's, summed
        found = self.client.perform(minutes_over(ks, shards, minutes))
        age = self.client.perform(oldest_over(ks, {queue: shards})).get(queue)
        return {
            "minutes": found,
            "chart": chart(found),
            "completed": sum(m.completed for m in found),
            "failed": sum(m.failed for m in found),
            "deaths": sum(m.deaths for m in found),
            "oldest_age": age,
            "alert_after": self.pending_alert,
            "gauge": min(1.0, (age or 0.0) / self.pending_alert),
        }

    def api_throughput(self, request: Request) -> Response:
        queue = check_queue(request.path_params["queue"])
        got = self.throughput(queue, self._minutes(request))
        body = {
            "queue": queue,
            "minutes": [
                {"at_ms": m.at, "completed": m.completed, "failed": m.failed, "deaths": m.deaths}
                for m in got["minutes"]
            ],
            "completed": got["completed"],
            "failed": got["failed"],
            "deaths": got["deaths"],
            "oldest_pending_age": got["oldest_age"],
        }
        if request.query_params.get("chart") == "1":
            body["chart"] = str(got["chart"])
        return JSONResponse(body)

    def workers(self, request: Request) -> Response:
        found = self.client.perform(read_workers(self.client.keys))
        return self.render(request, "workers.html", workers=found, live="api/workers")

    def api_workers(self, request: Request) -> Response:
        found = self.client.perform(read_workers(self.client.keys))
        return JSONResponse({"workers": [w.to_dict() for w in found]})


__all__ = ["MAX_BARS", "RANGES", "Monitoring", "bars", "chart"]
