"""The script registry: every ``lua/*.lua`` file, loaded once, called by SHA.

Each script file may pull in helpers with ``-- @include name`` lines (``lua/includes/name.lua``,
one local function per file). Includes are resolved once, depth-first and de-duplicated, when
the registry is first used; the resolved text's SHA1 is what ``EVALSHA`` sends. A server that
answers ``NOSCRIPT`` (restarted, flushed, a new Cluster node) gets the script loaded once and
the call retried once: see :mod:`echomq_core.wire.drivers`.

A script's first line may be a ``#!lua`` shebang declaring its flags (Redis 7+, Valkey):
it stays the first line of the resolved text, the includes follow it. Every script declares
one (:data:`FLAGS` lists the three kinds and why), so a full server refuses a script that
could grow its memory before it runs - all of it or nothing - and lets through only those
that cannot: readers (``no-writes``) and the few that only free memory (``allow-oom``).

The scripts ship as package data (``echomq_core/lua`` in a wheel); in a source checkout they are
read from the repository's top-level ``lua/``.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

_INCLUDE = re.compile(r"^--\s*@include\s+([A-Za-z0-9_]+)\s*$", re.MULTILINE)
#: The shebangs a script may start with. ``#!lua``: a writer that a full server (memory past
#: ``maxmemory``) refuses before it runs, so it writes all of its batch or nothing;
#: ``no-writes``: a reader, which runs whatever the memory; ``allow-oom``: a script that only
#: frees memory (deletes, trims, or rewrites what exists in place), which must run on a full
#: server - it is how memory is freed, or how a worker keeps its leases while full.
FLAGS = ("#!lua", "#!lua flags=no-writes", "#!lua flags=allow-oom")


@dataclass(frozen=True, slots=True)
class Script:
    """One resolved server-side script."""

    name: str
    source: str
    sha: str

    def __repr__(self) -> str:
        return f"Script({self.name!r}, sha={self.sha[:10]})"


def lua_dir() -> Path:
    """Where the ``.lua`` files are: inside the installed package, else the checkout's ``lua/``."""
    here = Path(__file__).resolve().parent.parent
    for candidate in (here / "lua", here.parent / "lua"):
        if (candidate / "includes").is_dir():
            return candidate
    raise FileNotFoundError(f"EchoMQ's lua/ directory is missing (looked beside {here})")


def _resolve(text: str, inc_dir: Path, seen: set[str]) -> str:
    parts: list[str] = []
    for name in _INCLUDE.findall(text):
        if name in seen:
            continue
        seen.add(name)
        path = inc_dir / f"{name}.lua"
        parts.append(_resolve(path.read_text(encoding="utf-8"), inc_dir, seen))
    parts.append(text)
    return "\n".join(parts)


@cache
def script(name: str) -> Script:
    """The resolved script ``lua/<name>.lua`` (read and hashed once per process)."""
    base = lua_dir()
    path = base / f"{name}.lua"
    text = path.read_text(encoding="utf-8")
    shebang = ""
    if text.startswith("#!"):  # the server reads the flags on the sent text's first line only
        shebang, _, text = text.partition("\n")
        if shebang not in FLAGS:
            raise ValueError(f"lua/{name}.lua: unknown shebang {shebang!r} (one of {FLAGS})")
        shebang += "\n"
    source = shebang + _resolve(text, base / "includes", set())
    return Script(name, source, hashlib.sha1(source.encode("utf-8")).hexdigest())


def all_scripts() -> list[Script]:
    """Every script in ``lua/`` (not the includes): what a test or a tool loads to check that
    every script compiles; calls load scripts lazily (NOSCRIPT, see drivers.py)."""
    return [script(p.stem) for p in sorted(lua_dir().glob("*.lua"))]
