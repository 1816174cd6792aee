"""A worker or a Pump behind a network partition the test controls:
``unshare -rn python partition_proc.py CONFIG_JSON`` (a network namespace of its own, made
without privileges: a user namespace maps the caller to root inside it).

Inside the namespace there is only a loopback. The process brings it up and relays
``127.0.0.1:<port>`` on it to the server's unix socket (a path in the file system, which the
namespace shares), so its worker or Pump talks TCP to the server over that loopback. The
test sends ``down`` / ``up`` on the control socket (a unix socket too): the loopback goes down
or up. Down, every packet of those TCP connections is dropped - sent data is retransmitted
and nothing arrives, as in a real partition (no reset, no error: calls just hang); up, the
retransmissions get through and the connections carry on.

CONFIG_JSON: role (``worker`` or ``pump``), unix (the server's socket), control (the control
socket path), gate (a directory), prefix, queues, lease (the worker's lease or the Pump's
outbox lease, s), pump_id. The worker's handler touches ``<gate>/started-<n>`` for its job,
waits until ``<gate>/go`` exists, and returns ``{"by": "partitioned"}``. It prints ``ready``
once it serves; it logs to stderr (the test reads it).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from echomq_core import EchoMQ, Job, Pump, Worker


def relay(unix: str) -> int:
    """Listen on the namespace's loopback; pipe each connection to the server's unix socket."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)

    def pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def serve() -> None:
        while True:
            conn, _ = listener.accept()
            upstream = socket.socket(socket.AF_UNIX)
            upstream.connect(unix)
            for a, b in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=pipe, args=(a, b), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return int(listener.getsockname()[1])


def control(path: str) -> None:
    """Serve ``down`` / ``up`` on the control socket: the loopback goes down or up."""
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    server.listen(4)

    def serve() -> None:
        while True:
            conn, _ = server.accept()
            with conn:
                word = conn.recv(16).decode().strip()
                if word in ("down", "up"):
                    subprocess.run(["ip", "link", "set", "lo", word], check=True)
                    logging.warning("partition: loopback %s", word)
                conn.sendall(b"ok\n")

    threading.Thread(target=serve, daemon=True).start()


def main() -> None:
    cfg: dict[str, Any] = json.loads(sys.argv[1])
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s"
    )
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    port = relay(cfg["unix"])
    control(cfg["control"])
    mq = EchoMQ(f"redis://127.0.0.1:{port}/0", prefix=cfg["prefix"])
    gate = Path(cfg["gate"])
    if cfg["role"] == "worker":

        def handle(job: Job) -> Any:
            (gate / f"started-{job.id.rsplit('.', 1)[-1]}").touch()
            while not (gate / "go").exists():
                time.sleep(0.01)
            return {"by": "partitioned"}

        worker = Worker(
            mq,
            {q: handle for q in cfg["queues"]},
            concurrency=1,
            lease=cfg["lease"],
            pump=False,
        )
        worker.start()
    else:
        Pump(mq, cfg["queues"], pump_id=cfg["pump_id"], lease=cfg["lease"]).start()
    print("ready", flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
