"""The documentation site as built: no Sphinx role shows raw, the API reference links its
cross-references, hides private bases and opens on ``EchoMQ`` (issue 48, item 11).

The build is the one ``.ci/run`` makes (``mkdocs build --strict``), into a temp directory;
the tools come from requirements-dev.txt, and without them the build tests are skipped.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

needs_mkdocs = pytest.mark.skipif(
    importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("griffe") is None,
    reason="the docs tools (requirements-dev.txt) are not installed",
)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env=dict(os.environ, NO_MKDOCS_2_WARNING="1"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return out


@needs_mkdocs
def test_no_page_shows_a_raw_role_and_the_reference_links(site: Path) -> None:
    from docs_hooks.roles import raw_roles

    pages = list(site.rglob("*.html"))
    raw = {str(p.relative_to(site)): raw_roles(p.read_text()) for p in pages}
    assert not {page: found for page, found in raw.items() if found}
    api = "".join(p.read_text() for p in (site / "api").rglob("*.html"))
    links = len(re.findall(r'class="autorefs autorefs-internal"', api))
    assert links > 150, links  # the roles became links (0 before the rewrite)
    assert "_Base" not in api  # private bases are not shown


@needs_mkdocs
def test_the_core_reference_opens_on_echomq_and_lists_every_export_once(site: Path) -> None:
    import echomq_core

    page = (site / "api" / "echomq_core" / "index.html").read_text()
    shown = re.findall(r'<h3 id="echomq_core\.(\w+)"', page)
    assert shown[0] == "EchoMQ"
    assert shown.index("EchoMQ") < shown.index("AsyncEchoMQ")
    assert sorted(shown) == sorted(echomq_core.__all__)


@needs_mkdocs
def test_the_build_fails_on_a_raw_role() -> None:
    """The check ``--strict`` lacks: a page with a role left raw fails the build."""
    from mkdocs.exceptions import PluginError

    from docs_hooks.roles import on_post_page, rewrite

    page = SimpleNamespace(file=SimpleNamespace(src_uri="api/x.md"))
    with pytest.raises(PluginError, match="1 Sphinx role"):
        on_post_page("<p>see :class:<code>EchoMQ</code></p>", page, None)
    assert on_post_page("<p>see <code>EchoMQ</code></p>", page, None)
    import griffe

    module = griffe.Module("echomq_core")
    text = rewrite(module, "a :meth:`~echomq_core.EchoMQ.wait`, :class:`the client <EchoMQ>`")
    assert text == (
        'a <autoref identifier="echomq_core.EchoMQ.wait" optional><code>wait()</code></autoref>'
        ', <autoref identifier="EchoMQ" optional><code>the client</code></autoref>'
    )
