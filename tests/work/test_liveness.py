"""``/healthz`` of a worker and a Pump (echomq_core.work.liveness): 200 while their loops turn, 503
naming the loop once one is stuck - a real stuck heartbeat loop, not a faked clock, for the
worker; the Pump's allowance checked on a clock the test moves."""

from __future__ import annotations

import urllib.error
import urllib.request

from echomq_core import EchoMQ, Pump, Worker
from echomq_core.seeing.process_metrics import ProcessMetrics
from echomq_core.work.liveness import Liveness

from ..waiting import eventually


def probe(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read().decode()


def test_a_worker_whose_heartbeat_loop_is_stuck_is_not_alive(mq: EchoMQ) -> None:
    metrics = ProcessMetrics()
    worker = Worker(mq, {"lv": lambda job: job.payload}, lease=1.0, pump=False)
    metrics.watch_worker(worker)
    server = metrics.serve(0)
    url = f"http://127.0.0.1:{server.port}/healthz"
    worker.start()
    try:
        assert probe(url) == (200, "ok\n")
        assert probe(url.replace("/healthz", "/metrics"))[0] == 200
        # the gate: the heartbeat loop takes the worker's lock to list what it extends, so
        # while the test holds it the loop is stuck as a hung call would leave it
        with worker._lock:
            _, text = eventually(lambda: (r := probe(url))[0] == 503 and r, timeout=30)
        assert "worker heartbeat loop: nothing for" in text
        assert eventually(lambda: probe(url) == (200, "ok\n"), timeout=30)  # turning again
    finally:
        worker.stop()
        metrics.close()


def test_a_pump_whose_ticks_stop_is_not_alive(mq: EchoMQ) -> None:
    now = [1000.0]
    metrics = ProcessMetrics(liveness=Liveness(clock=lambda: now[0]))
    pump = Pump(mq, ["lv"], interval=0.5)
    metrics.watch_pump(pump)
    server = metrics.serve(0)
    url = f"http://127.0.0.1:{server.port}/healthz"
    try:
        pump.tick()
        now[0] += 59.0  # max(60, 10 x interval) allowed
        assert probe(url) == (200, "ok\n")
        now[0] += 2.0
        code, text = probe(url)
        assert code == 503 and "pump ticks: nothing for 61 s (allowed 60 s)" in text
        pump.tick()
        assert probe(url) == (200, "ok\n")
    finally:
        metrics.close()


def test_a_started_worker_with_a_dead_thread_is_not_alive(mq: EchoMQ) -> None:
    """A threaded worker's fetcher, flusher and heartbeat threads are checked once it has
    started: a worker stopped (its threads gone) while the probe still runs answers 503."""
    metrics = ProcessMetrics()
    worker = Worker(mq, {"lv": lambda job: job.payload}, pump=False)
    metrics.watch_worker(worker)
    server = metrics.serve(0)
    url = f"http://127.0.0.1:{server.port}/healthz"
    assert probe(url) == (200, "ok\n")  # not started yet: nothing to check
    worker.start()
    try:
        assert probe(url) == (200, "ok\n")
    finally:
        worker.stop()
    code, text = probe(url)
    assert code == 503 and "worker thread(s) not running: echomq-fetch" in text
    metrics.close()
