"""Every Python block of the README and of the documentation runs as written.

Each block is run here, in a fresh interpreter, against a server the suite started (standalone
and the 3-master Cluster). The one change made to a block is its server: the documented
``EchoMQ("redis://localhost:6379/0")`` (what ``echomq server --port 6379`` serves) becomes the
test server's URL with a prefix of the test's own, so runs do not meet. A block that is only a
fragment (it names things defined elsewhere) says so where the reader sees it - its fence reads
```` ```python title="Fragment: ..." ```` - and is not run; a block whose page says
"It prints `...`" right after it must print exactly that. Blocks that need Airflow or Dagster
run where those are installed (the suite's venvs). A block titled with a file's path
(```` ```python title="dags/reports.py" ````) is a file of an example: it runs here as any
block does, and the example's own test deploys it as that file (the README's DAG in a real
Airflow deployment: tests/airflow/test_readme_dag.py).

Also here, as it concerns the READMEs as the packages' long descriptions on an index page (the
main one, and the Airflow provider's and the Dagster integration's): their links are absolute (a
relative link or image breaks there). And a Dagster block runs without Dagster's BetaWarning or
PreviewWarning on stderr: an example that warns teaches a newcomer an API that may change.
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from .conftest import Backend

ROOT = Path(__file__).resolve().parent.parent
#: The READMEs that are the distributions' long descriptions on the package index.
READMES = ["README.md", "airflow_provider/README.md", "dagster_integration/README.md"]
#: The pages whose Python blocks must run as written: the READMEs and every page of the site.
PAGES = [*READMES, *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md"))]
#: Dagster's warnings of an API that may change (``dagster._annotations``).
DAGSTER_API_WARNING = re.compile(r"\b(BetaWarning|PreviewWarning|SupersessionWarning)\b")
DOCUMENTED_URL = re.compile(r'"redis://localhost:6379/0"(, prefix="[^"]*")?')
FRAGMENT = re.compile(r'^```python title="Fragment\b')
#: A block that is a file of an example (``title="dags/reports.py"``): run here as any block
#: is, and deployed as that file by the test of its example (tests/airflow/test_readme_dag.py).
FILE = re.compile(r'^```python title="(?P<path>[\w./-]+\.py)"$')


@dataclass(frozen=True)
class Block:
    page: str
    line: int  # of the opening fence, 1-based
    code: str
    fragment: bool
    prints: str | None  # what the text after the block says it prints
    file: str | None = None  # the file it is, for a block titled with a path (FILE)

    def __str__(self) -> str:
        return f"{self.page}:{self.line}"


def blocks(page: str) -> list[Block]:
    """The fenced blocks of ``page`` whose info string is ``python``."""
    lines = (ROOT / page).read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        fence = lines[i].strip()
        if fence.startswith("```python"):
            start, indent = i, len(lines[i]) - len(lines[i].lstrip())
            end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
            after = " ".join(lines[end + 1 : end + 4])
            said = re.match(r"\s*It prints `([^`]*)`", after)
            code = "\n".join(ln[indent:] for ln in lines[start + 1 : end]) + "\n"
            fragment = FRAGMENT.match(fence) is not None
            known = fragment or fence == "```python" or FILE.match(fence) is not None
            assert known, f"{page}:{i + 1}: unknown fence {fence!r}"
            named = FILE.match(fence)
            path = named["path"] if named else None
            found.append(Block(page, start + 1, code, fragment, said[1] if said else None, path))
            i = end
        i += 1
    return found


ALL = [b for page in PAGES for b in blocks(page)]


def test_the_pages_have_blocks_to_run() -> None:
    assert [b for b in ALL if b.page == "README.md" and not b.fragment]
    assert [b for b in ALL if b.page == "docs/getting-started.md" and not b.fragment]


@pytest.mark.parametrize("block", [b for b in ALL if not b.fragment], ids=str)
def test_a_block_runs_as_written(
    block: Block, backend: Backend, prefix: str, proc_env: dict[str, str], tmp_path: Path
) -> None:
    code = block.code
    if "airflow" in code:
        pytest.importorskip("airflow.sdk")
        proc_env = dict(proc_env, AIRFLOW_HOME=str(tmp_path / "airflow"))
    if "dagster" in code:
        pytest.importorskip("dagster")
    if "EchoMQ(" in code:
        assert DOCUMENTED_URL.search(code), f"{block}: connects elsewhere than the documented URL"
    server = f"{backend.url!r}, cluster={backend.cluster!r}, prefix={prefix!r}"
    code = DOCUMENTED_URL.sub(lambda _: server, code)
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=proc_env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, f"{block} failed:\n{done.stdout}\n{done.stderr[-4000:]}"
    if block.prints is not None:
        assert done.stdout.strip() == block.prints, f"{block} printed {done.stdout!r}"
    if "dagster" in code:
        warned = [ln for ln in done.stderr.splitlines() if DAGSTER_API_WARNING.search(ln)]
        assert not warned, f"{block} printed Dagster's warnings of an API that may change: {warned}"


def run_block(block: Block, backend: Backend, prefix: str, env: dict[str, str], cwd: Path) -> str:
    """Run ``block`` as :func:`test_a_block_runs_as_written` does; its stdout."""
    server = f"{backend.url!r}, cluster={backend.cluster!r}, prefix={prefix!r}"
    code = DOCUMENTED_URL.sub(lambda _: server, block.code)
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, f"{block} failed:\n{done.stdout}\n{done.stderr[-4000:]}"
    return done.stdout


#: The core blocks that use a server: a reader runs an example again (after an edit, or to see
#: it once more) against the same server, and it must work as it did the first time.
AGAIN = [
    b
    for b in ALL
    if not b.fragment and "EchoMQ(" in b.code and "airflow" not in b.code
    and "dagster" not in b.code
]  # fmt: skip


@pytest.mark.onlystandalone
@pytest.mark.parametrize("block", AGAIN, ids=str)
def test_a_block_runs_again_on_the_same_server(
    block: Block, backend: Backend, prefix: str, proc_env: dict[str, str], tmp_path: Path
) -> None:
    first = run_block(block, backend, prefix, proc_env, tmp_path)
    second = run_block(block, backend, prefix, proc_env, tmp_path)
    if block.prints is not None:
        assert (first.strip(), second.strip()) == (block.prints, block.prints)


def test_the_dagster_pages_have_blocks_to_run() -> None:
    """The no-warning check above has something to check."""
    assert [b for b in ALL if b.page == "docs/dagster.md" and not b.fragment]
    assert [b for b in ALL if b.page == "dagster_integration/README.md" and not b.fragment]


@pytest.mark.parametrize("readme", READMES)
def test_the_readme_links_are_absolute(readme: str) -> None:
    text = (ROOT / readme).read_text()
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert links
    relative = [link for link in links if not re.match(r"https?://", link)]
    assert not relative, f"{readme}: relative links break on a package index page: {relative}"
    images = re.findall(r"<img[^>]*src=\"([^\"]+)\"", text)
    assert all(re.match(r"https?://", src) for src in images), f"{readme}: relative image {images}"


#: Our distributions, which the package index does not have yet.
OURS = re.compile(r"^'?(echomq|airflow-provider-echomq|dagster-echomq)(\[[^\]]*\])?'?$")
#: The pages that tell a reader how to install.
INSTALL_PAGES = [*READMES, "docs/getting-started.md", "docs/airflow.md", "docs/dagster.md"]


def pip_install_lines(page: str) -> list[list[str]]:
    """The arguments of each ``pip install`` line in the page's shell blocks."""
    text = (ROOT / page).read_text()
    found = []
    for block in re.findall(r"^```(?:bash|sh|console)\n(.*?)^```", text, re.M | re.S):
        for line in block.splitlines():
            line = line.split("#", 1)[0].strip()
            if line.startswith("pip install "):
                found.append(line.split()[2:])
    return found


@pytest.mark.parametrize("page", INSTALL_PAGES)
def test_the_install_lines_name_no_distribution_the_index_lacks(page: str) -> None:
    """Until the packages are published, every install block installs from the checkout (a
    directory with a pyproject, or a wheel built from one), the page says so, and the pages
    that give the site's and the repository's addresses say they are not live yet."""
    lines = pip_install_lines(page)
    assert lines, f"{page}: no pip install line"
    for args in lines:
        named = [a for a in args if OURS.match(a)]
        assert not named, f"{page}: {named} are not on the package index yet"
        for arg in args:
            path = arg.strip("'").split("[", 1)[0]
            if arg.startswith("-") or "*" in path or path.startswith("dist/"):
                continue
            assert (ROOT / path / "pyproject.toml").exists(), f"{page}: {arg} is no project"
    said = " ".join((ROOT / page).read_text().lower().split())
    if page in (*READMES, "docs/getting-started.md"):  # the pages that give the addresses
        assert "not live yet" in said, f"{page}: its addresses are not called placeholders"
    assert "not on the package index yet" in said, page


def test_the_documented_install_command_installs_the_three(tmp_path: Path) -> None:
    """The README's one command, run from the checkout (into a target directory, without
    dependencies or the index: what it installs is what is checked)."""
    (args,) = pip_install_lines("README.md")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
         "--no-deps", "--no-build-isolation", "--no-index", "--target", str(tmp_path),
         *(a.strip("'") for a in args)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    tops = {p.name for p in tmp_path.iterdir()}
    assert {"echomq_core", "echomq_provider", "dagster_echomq"} <= tops, tops


#: What a concept page leaves to docs/reference/internals.md: a bench's name or results, a
#: per-child cost in microseconds, a key's field encoding (``done: <token length>:...``).
INTERNALS = re.compile(r"\bbench[/.]|\b\d+(?:\.\d+)? us\b|`\w+: <")
CONCEPTS = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs" / "concepts").glob("*.md"))


@pytest.mark.parametrize("page", CONCEPTS)
def test_a_concept_page_leaves_internals_to_the_reference(page: str) -> None:
    """A concept page is what a user does and sees; encodings and the derivations of measured
    figures are on the internals page, which the site lists (issue 48, item 12)."""
    found = [ln for ln in (ROOT / page).read_text().splitlines() if INTERNALS.search(ln)]
    assert not found, f"{page}: move to docs/reference/internals.md: {found}"


def test_the_internals_page_is_in_the_site() -> None:
    assert "reference/internals.md" in (ROOT / "mkdocs.yml").read_text()
    assert (ROOT / "docs" / "reference" / "internals.md").exists()


def test_the_documented_wheels_build_and_install(tmp_path: Path) -> None:
    """Getting started's other way: wheels built from the checkout, then installed from
    ``dist/`` (into a target directory, without dependencies or the index)."""
    import glob
    import shlex

    text = (ROOT / "docs" / "getting-started.md").read_text()
    block = re.search(r"```bash\n(pip wheel .*?)```", text, re.S)
    assert block is not None
    build, install = [shlex.split(line) for line in block[1].splitlines() if line.strip()]
    assert build[:2] == ["pip", "wheel"] and install[:2] == ["pip", "install"]
    dist = build[build.index("-w") + 1]
    options = ["--quiet", "--disable-pip-version-check", "--no-build-isolation", "--no-index"]
    args = [a if a != dist else str(tmp_path / dist) for a in build[2:]]
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", *options, *args],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-3000:]
    wheels = [w for a in install[2:] for w in (sorted(glob.glob(a, root_dir=tmp_path)) or [a])]
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", *options, "--no-deps",
         "--target", str(tmp_path / "site"), *wheels],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    tops = {p.name for p in (tmp_path / "site").iterdir()}
    assert {"echomq_core", "echomq_provider", "dagster_echomq"} <= tops, tops
