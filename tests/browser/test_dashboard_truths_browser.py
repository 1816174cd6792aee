"""What only a browser shows of issue 48's dashboard items: the 24 h chart's y-axis label drawn
inside the chart (its box measured in Chromium, not guessed from the markup), and a queue page
opened without a tab showing rows, in headless Chromium against a real ``echomq dashboard``
process on a real server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from echomq_core import EchoMQ, JobSpec
from echomq_core.wire.calls import Call, Op

from ..dashkit import Dashboard
from .cdp import Browser


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    b = Browser(width=1400, height=1000)
    yield b
    b.close()


def _sent(call: Call) -> Op[object]:
    (reply,) = yield [call]
    return reply


#: The chart's top label, its box in the SVG's own units, and the SVG's box on the page.
LABEL_BOX = """(() => {
  const svg = document.querySelector('#throughput-chart');
  const top = svg.querySelector('text.tick');
  const b = top.getBBox(), s = svg.getBoundingClientRect(), t = top.getBoundingClientRect();
  return {text: top.textContent, x: b.x, svgLeft: s.left, labelLeft: t.left};
})()"""


def test_the_24h_charts_top_label_is_inside_the_chart(
    browser: Browser, client: EchoMQ, readonly: Dashboard
) -> None:
    """A busy queue: 123,456 completions in this minute (one minute field, as the workers
    tally them).
    Its top label (``123,456``) was drawn right-aligned at x = 24, so it began left of the
    SVG's edge and was clipped; now its box starts inside the SVG."""
    seconds, _micros = client.perform(_sent(Call.cmd("TIME")))  # type: ignore[misc]
    minute = int(seconds) // 60  # this minute's field, as lua/includes/tally.lua writes it
    field = f"{minute % 1440}"
    tally = f"{minute} 123456 2345 120"
    client.perform(_sent(Call.cmd("HSET", client.keys.minutes("tb-busy"), field, tally)))
    client.queue("tb-busy").add({"n": 1})
    browser.goto(f"{readonly.base}/queue/tb-busy?minutes=1440")
    browser.wait_for("document.querySelector('#throughput-chart') !== null")
    box = browser.js(LABEL_BOX)
    assert box["text"] == "125,801"
    assert box["x"] >= 0, box  # in the SVG's units: nothing of it left of the viewBox
    assert box["labelLeft"] >= box["svgLeft"], box
    assert browser.errors() == []


def test_a_queue_page_opened_without_a_tab_shows_jobs(
    browser: Browser, client: EchoMQ, readonly: Dashboard
) -> None:
    """A queue whose 60 jobs all completed, opened from the queues page's link (no tab named):
    the page shows completed jobs, not an empty pending list."""
    q = client.queue("tb-done")
    q.add_bulk([JobSpec({"n": i}) for i in range(60)])
    q.complete_many([(j, j.payload["n"]) for j in q.claim(60)])
    browser.goto(f"{readonly.base}/")
    href = browser.js("document.querySelector('tr[data-queue=\"tb-done\"] td a').href")
    browser.goto(href)
    browser.wait_for("document.querySelector('#states') !== null")
    assert browser.js("document.querySelector('#states a.on').dataset.state") == "completed"
    assert browser.js("document.querySelectorAll('#jobs tbody tr').length") == 50
    assert browser.errors() == []
