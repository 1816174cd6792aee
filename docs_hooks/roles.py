"""The API reference's docstrings, made readable at build time (issue 48, item 11).

The docstrings are written with Sphinx roles (``:class:`~echomq_core.EchoMQ```); mkdocstrings
renders Markdown and leaves the roles raw (``:class:EchoMQ``). Rewriting them in the sources
would touch every module that others edit in parallel, so they are rewritten here, where the
docs are built:

- :class:`SphinxRoles`, a Griffe extension (``mkdocs.yml``: the python handler's
  ``extensions``): once a package is loaded, each docstring's roles become autorefs - a link to
  the object's entry when the reference documents it, its name in code otherwise (an
  ``optional`` autoref, so an undocumented target never fails ``--strict``). A relative target
  (``:meth:`wait```) is looked up from the object outward (its class, its module, its
  package), as Sphinx does. Private bases (``_Base``) are dropped from the classes' bases:
  they are not API, and the reference does not document them.
- :func:`on_post_page`, a MkDocs hook (``mkdocs.yml``: ``hooks``): fails the build on any role
  left raw in a built page, whatever wrote it, so a new form of role cannot come back
  unnoticed.
"""

from __future__ import annotations

import html
import re
from typing import Any

import griffe
from mkdocs.exceptions import PluginError

#: A Sphinx role in a docstring: ``:class:`target```, ``:meth:`~a.b.c```, ``:func:`title <t>```.
ROLE = re.compile(
    r":(?:py:)?(?P<role>class|meth|func|mod|attr|data|exc|obj|const):`(?P<body>[^`]+)`"
)
#: A role as it shows raw in built HTML (mkdocstrings renders the backticks as <code>).
RAW_ROLE = re.compile(
    r":(?:py:)?(?:class|meth|func|mod|attr|data|exc|obj|const):(?:<code>|`)"
)
#: The packages the reference documents: a target starting with one is absolute.
PACKAGES = ("echomq_core", "echomq_provider", "dagster_echomq")


def _lookup(scope: griffe.Object | griffe.Alias | None, target: str) -> str | None:
    """``target``'s full path if it is a member of ``scope`` or of a scope around it."""
    while scope is not None:
        try:
            found = scope[target]
            if found.is_alias:  # an imported name: the object's own path is what is documented
                found = found.final_target
            return str(found.path)
        except (KeyError, ValueError, griffe.AliasResolutionError, griffe.CyclicAliasError):
            scope = scope.parent
    return None


def autoref(obj: griffe.Object | griffe.Alias, role: str, body: str) -> str:
    """The autoref for one role found in ``obj``'s docstring."""
    title, _, explicit = body.partition(" <")
    if explicit:  # :meth:`title <target>`
        target = explicit.rstrip(">").strip()
        shown = title.strip()
    else:
        target = body.strip()
        short = target.startswith("~")
        target = target.lstrip("~")
        shown = target.rsplit(".", 1)[-1] if short else target
    target = target.lstrip(".")
    if role in ("meth", "func") and not shown.endswith(")"):
        shown += "()"
    identifier = target
    if not target.startswith(PACKAGES):
        identifier = _lookup(obj, target) or target
    return (
        f'<autoref identifier="{html.escape(identifier)}" optional>'
        f"<code>{html.escape(shown)}</code></autoref>"
    )


def rewrite(obj: griffe.Object | griffe.Alias, text: str) -> str:
    """``text`` with every role replaced by its autoref."""
    return ROLE.sub(lambda m: autoref(obj, m["role"], m["body"]), text)


def _walk(obj: griffe.Object) -> Any:
    yield obj
    for member in obj.members.values():
        if not member.is_alias:
            yield from _walk(member)  # type: ignore[arg-type]


class SphinxRoles(griffe.Extension):
    """Rewrite the roles of every docstring of a loaded package; drop private bases."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        for obj in _walk(pkg):
            if obj.docstring is not None:
                obj.docstring.value = rewrite(obj, obj.docstring.value)
            if isinstance(obj, griffe.Class):
                obj.bases = [b for b in obj.bases if not str(b).rsplit(".", 1)[-1].startswith("_")]


def raw_roles(page_html: str) -> list[str]:
    """The roles left raw in a built page, each with a little of what follows it."""
    return [page_html[m.start() : m.end() + 40] for m in RAW_ROLE.finditer(page_html)]


def on_post_page(output: str, page: Any, config: Any) -> str:
    """Fail the build on a page that shows a role raw."""
    found = raw_roles(output)
    if found:
        raise PluginError(
            f"{page.file.src_uri}: {len(found)} Sphinx role(s) left raw, first {found[0]!r}: "
            "the docs_hooks/roles.py rewrite missed a form"
        )
    return output
