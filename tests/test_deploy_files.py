"""deploy/: the compose files, Dockerfiles and Kubernetes manifests users deploy from, checked
here because no Docker daemon or cluster runs in CI: every file parses; every image is built
from a Dockerfile of the project or pinned to a version; every file a Dockerfile copies exists;
every `echomq` command parses with the CLI's own parser, and every Airflow and Dagster command
with its `--help`; every environment variable is one that EchoMQ, Airflow or the image reads;
the probes and scrape annotations point at the port the process serves; and the commands are
the ones the deployment tests run as processes (tests/airflow/test_production.py,
tests/dagster/test_dagster_production.py)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from echomq_core.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
BIN = Path(sys.executable).parent
COMPOSE = {"airflow": DEPLOY / "airflow" / "docker-compose.yml",
           "dagster": DEPLOY / "dagster" / "docker-compose.yml"}  # fmt: skip
#: variables the official images read (postgres) and Dagster's instance
OUTSIDE = {"POSTGRES_USER", "POSTGRES_PASSWORD", "POSTGRES_DB", "DAGSTER_HOME"}


def compose(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(COMPOSE[name].read_text())  # anchors and << merged
    return doc["services"]


def dockerfile(service: dict[str, Any]) -> Path:
    build = service["build"]
    return (COMPOSE_DIR / build["context"] / build["dockerfile"]).resolve()


COMPOSE_DIR = DEPLOY / "airflow"  # both compose files sit one level below deploy/


def argv(service: dict[str, Any]) -> list[str]:
    """What the container runs: its entrypoint (the echomq image's is ``echomq``) + command."""
    entry = service.get("entrypoint")
    if entry is None and service.get("image") == "echomq":
        entry = ["echomq"]
    return [*(entry or []), *[str(a) for a in service.get("command", [])]]


def echomq_parses(args: list[str]) -> Any:
    return build_parser().parse_args(args)


def test_every_file_parses_and_every_image_is_built_here_or_pinned() -> None:
    for name in COMPOSE:
        for service_name, service in compose(name).items():
            if "build" in service:
                path = dockerfile(service)
                assert path.is_file(), (service_name, path)
            else:
                image = service["image"]
                assert re.fullmatch(r"[a-z0-9./-]+:\d[\w.-]*", image), (service_name, image)
    for path in (DEPLOY / "docker").glob("*.Dockerfile"):
        text = path.read_text()
        for base in re.findall(r"^FROM (\S+)", text, re.MULTILINE):
            assert re.fullmatch(r"[a-z0-9./-]+:\d[\w.-]*", base), (path.name, base)
        for line in re.findall(r"^COPY (?:--\S+ )*(.+)$", text, re.MULTILINE):
            *sources, _ = line.split()
            for source in sources:
                assert (ROOT / source).exists(), (path.name, source)
    docs = list(yaml.safe_load_all((DEPLOY / "kubernetes" / "echomq.yaml").read_text()))
    assert {d["kind"] for d in docs} == {"ConfigMap", "Deployment"}
    yaml.safe_load((DEPLOY / "dagster" / "dagster.yaml").read_text())
    yaml.safe_load((DEPLOY / "dagster" / "workspace.yaml").read_text())


@pytest.mark.parametrize("name", sorted(COMPOSE))
def test_every_command_parses(name: str) -> None:
    helps: list[tuple[str, list[str], subprocess.Popen[str]]] = []
    for service_name, service in compose(name).items():
        command = argv(service)
        if not command or command[0] in ("valkey-server",):
            continue
        if command[0] == "echomq":
            echomq_parses(command[1:])  # argparse exits 2 on anything wrong
        elif command[0] == "python":  # a script the image copies into its working directory
            copied = dockerfile(service).read_text()
            assert command[1] in copied, (service_name, command)
        else:
            tool = command[0]
            # Airflow's and Dagster's parsers: the subcommand path with --help (all at once)
            words = [w for w in command[1:] if not w.startswith("-")][:2]
            path = words if tool in ("airflow", "dagster") else []
            if tool == "airflow" and path[:1] != ["celery"]:
                path = path[:1]
            proc = subprocess.Popen(
                [str(BIN / tool), *path, "--help"],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            helps.append((service_name, command, proc))
    for service_name, command, proc in helps:
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, (service_name, command, err[-500:])
        for option in (w for w in command[1:] if w.startswith("--")):
            assert option in out, (service_name, option)


@pytest.mark.parametrize("name", sorted(COMPOSE))
def test_every_environment_variable_is_read_by_someone(name: str) -> None:
    from airflow.configuration import conf

    # every option Airflow and its providers describe (has_option is False for an option
    # whose default is unset, such as [celery] result_backend)
    described = {
        (section, key)
        for section, body in conf.configuration_description.items()
        for key in body.get("options", {})
    }
    source = "\n".join(p.read_text() for p in (ROOT / "echomq_core").rglob("*.py"))
    dagster_yaml = (DEPLOY / "dagster" / "dagster.yaml").read_text()
    for service_name, service in compose(name).items():
        for var in service.get("environment", {}):
            if var.startswith("AIRFLOW__"):
                _, section, key = var.split("__", 2)
                assert (section.lower(), key.lower()) in described, (service_name, var)
            elif var.startswith("AIRFLOW_CONN_"):
                assert var == "AIRFLOW_CONN_ECHOMQ_DEFAULT", var  # the provider's default conn
                uri = service["environment"][var]
                assert uri.startswith("echomq://") and "prefix=" in uri
            elif var.startswith("ECHOMQ_"):
                assert f'"{var}"' in source, (service_name, var)
            elif var == "DAGSTER_PG_URL":
                assert f"env: {var}" in dagster_yaml
            else:
                assert var in OUTSIDE, (service_name, var)


def test_the_kubernetes_probes_and_scrapes_point_at_the_served_port() -> None:
    docs = yaml.safe_load_all((DEPLOY / "kubernetes" / "echomq.yaml").read_text())
    deployments = [d for d in docs if d["kind"] == "Deployment"]
    assert {d["metadata"]["name"] for d in deployments} == {"echomq-worker", "echomq-pump"}
    for deployment in deployments:
        pod = deployment["spec"]["template"]
        (container,) = pod["spec"]["containers"]
        args = echomq_parses([str(a) for a in container["args"]])
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        probe = container["livenessProbe"]["httpGet"]
        assert probe["path"] == "/healthz"
        assert ports[probe["port"]] == args.metrics_port
        assert args.metrics_host == "0.0.0.0"  # reachable by the kubelet and Prometheus
        notes = pod["metadata"]["annotations"]
        assert notes["prometheus.io/scrape"] == "true"
        assert int(notes["prometheus.io/port"]) == args.metrics_port
        assert notes["prometheus.io/path"] == "/metrics"
        if args.command == "worker":  # SIGTERM drains for --grace: the pod waits longer
            assert pod["spec"]["terminationGracePeriodSeconds"] > args.grace


def test_the_compose_commands_are_the_ones_the_deployment_tests_run() -> None:
    sys.path.insert(0, str(ROOT / "examples" / "airflow"))
    from deployment import Deployment

    airflow = compose("airflow")
    worker = echomq_parses(argv(airflow["echomq-worker"])[1:])
    defaults = Deployment.__init__.__kwdefaults__ or {}
    assert worker.queues == list(defaults["worker_queues"])
    assert worker.app == [defaults["worker_app"]]
    assert argv(airflow["celery-worker"])[:3] == ["airflow", "celery", "worker"]
    for component in ("scheduler", "triggerer", "api-server", "dag-processor"):
        assert argv(airflow[component])[:2] == ["airflow", component]
    dagster = compose("dagster")
    production = (ROOT / "tests" / "dagster" / "test_dagster_production.py").read_text()
    assert argv(dagster["code-server"])[:3] == ["dagster", "code-server", "start"]
    assert '"code-server", "start"' in production
    assert argv(dagster["daemon"])[:2] == ["dagster-daemon", "run"]
    assert '"dagster-daemon"), "run"' in production
    assert "QueuedRunCoordinator" in (DEPLOY / "dagster" / "dagster.yaml").read_text()
