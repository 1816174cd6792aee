"""Every server-side script compiles on a real server and is called by the SHA the registry
computed; every script file has a header naming what it does, every key and argument it reads
by position, and who removes what it writes."""

from __future__ import annotations

import re
from pathlib import Path

from echomq_core.server import EmbeddedServer
from echomq_core.wire.keyspace import QUEUE_KEYS, Keyspace
from echomq_core.wire.scripts import _INCLUDE, FLAGS, all_scripts, lua_dir


def test_every_script_loads_under_its_sha(standalone_server: EmbeddedServer) -> None:
    import redis

    client = redis.Redis.from_url(standalone_server.url)
    scripts = all_scripts()
    assert len(scripts) == len(list(lua_dir().glob("*.lua")))
    for script in scripts:
        assert client.script_load(script.source) == script.sha, script.name
        # the flags first (the server reads only the first line), then the includes, then the
        # script's header
        flags, first = script.source.splitlines()[:2]
        assert flags in FLAGS, f"{script.name}: no flags declared (a full server's refusal)"
        assert first.startswith("-- "), f"{script.name}: its includes come first, then a header"
    client.close()


def test_every_script_file_opens_with_its_contract() -> None:
    for path in sorted(lua_dir().glob("*.lua")):
        flags, head = path.read_text().splitlines()[:2]
        assert flags in FLAGS, f"{path.name} opens with {flags!r}, not its flags"
        assert "Full server: " in _header(path), f"{path.name}: why it may run when full?"
        assert head.startswith(f"-- {path.stem}: "), f"{path.name} opens with {head!r}"
        assert "Owner of what it writes" in _header(path), f"{path.name}: who removes what?"


# -- the header names every KEYS[i] and ARGV[i] the code reads ------------------------------

_USE = re.compile(r"\b(KEYS|ARGV)\[([^\]]+)\]")
_UNPACK = re.compile(r"unpack\((KEYS|ARGV),\s*([^,)]+)(?:,\s*([^)]+))?\)")
_INT = re.compile(r"\d+")
_LEAD = re.compile(r"(\d+)\s*\+")


def _split(path: Path) -> tuple[list[str], list[str]]:
    """(header lines, code lines with comments cut): the header is the leading comment block."""
    lines = path.read_text().splitlines()
    if lines and lines[0].startswith("#!"):  # the flags: a blank line for the line numbers
        lines[0] = "--"
    n = next((i for i, line in enumerate(lines) if not line.startswith("--")), len(lines))
    return lines[:n], [line.split("--", 1)[0] for line in lines[n:]]


def _header(path: Path, seen: set[str] | None = None) -> str:
    """The script's header and, resolved depth-first, the headers of the includes it pulls in
    (a key an include names, such as the queue keys, is named for the script too)."""
    seen = set() if seen is None else seen
    head = "\n".join(_split(path)[0])
    parts = [head]
    for name in _INCLUDE.findall(head):
        if name not in seen:
            seen.add(name)
            parts.append(_header(lua_dir() / "includes" / f"{name}.lua", seen))
    return "\n".join(parts)


class _Named:
    """What a header names for KEYS or ARGV: positions, ranges, open tails and the bases of
    positions that depend on a count (``KEYS[15+i]``, ``KEYS[17+7(i-1)+1 .. +7]``)."""

    def __init__(self, header: str, table: str) -> None:
        self.ints: set[int] = set()
        self.open_from: int | None = None
        self.bases: set[int] = set()
        self.dynamic = False
        for spec in re.findall(rf"\b{table}\[([^\]]+)\]", header):
            spec = spec.replace(" ", "")
            if _INT.fullmatch(spec):
                self.ints.add(int(spec))
            elif m := re.fullmatch(r"(\d+)\.\.(\d+)", spec):
                self.ints.update(range(int(m[1]), int(m[2]) + 1))
            elif m := re.fullmatch(r"(\d+)\.\.", spec):
                start = int(m[1])
                self.open_from = start if self.open_from is None else min(self.open_from, start)
            else:
                self.dynamic = True
                if m := _LEAD.match(spec):
                    self.bases.add(int(m[1]))

    def covers(self, expr: str) -> bool:
        expr = expr.strip()
        if _INT.fullmatch(expr):
            n = int(expr)
            return n in self.ints or (self.open_from is not None and n >= self.open_from)
        if m := _LEAD.match(expr):  # <base> + <count-dependent part>
            base = int(m[1])
            # named as such, in an open tail, or as the range that starts right after it
            # (``ARGV[1 + i]`` over the defaults ``ARGV[2..15]``)
            return (
                base in self.bases
                or base + 1 in self.ints
                or (self.open_from is not None and base + 1 >= self.open_from)
            )
        return self.dynamic or self.open_from is not None


def _unnamed(path: Path) -> list[str]:
    header = _header(path)
    named = {table: _Named(header, table) for table in ("KEYS", "ARGV")}
    missing = []
    for number, line in enumerate(_split(path)[1], len(_split(path)[0]) + 1):
        uses = [(t, e) for t, e in _USE.findall(line)]
        for table, start, end in _UNPACK.findall(line):
            uses.append((table, start))
            if end and _INT.fullmatch(end.strip()):
                uses.append((table, end))
        for table, expr in uses:
            if not named[table].covers(expr):
                missing.append(f"{path.name}:{number}: {table}[{expr.strip()}]")
    return missing


def test_every_key_and_argument_a_script_reads_is_named_in_its_header() -> None:
    missing = [m for path in sorted(lua_dir().glob("*.lua")) for m in _unnamed(path)]
    assert not missing, "not named in the header:\n" + "\n".join(missing)


def test_the_check_sees_an_unnamed_key() -> None:
    """The check above can fail: a script that reads a key its header does not name is caught."""
    text = "-- x: a script\n-- KEYS[1] row\n-- ARGV[1] id\nreturn redis.call('GET', KEYS[2])\n"
    path = Path(__file__).with_name("_unnamed_probe.lua")
    path.write_text(text)
    try:
        assert _unnamed(path) == ["_unnamed_probe.lua:4: KEYS[2]"]
    finally:
        path.unlink()


def test_no_include_reads_keys_or_arguments_itself() -> None:
    """An include takes the keys (and arguments) it works on as parameters, so its caller's
    header is where they are named."""
    for path in sorted((lua_dir() / "includes").glob("*.lua")):
        code = "\n".join(_split(path)[1])
        assert not re.search(r"\b(KEYS|ARGV)\b", code), f"{path.name} reads KEYS or ARGV"
        functions = re.findall(r"^local function (\w+)", code, re.MULTILINE)
        assert functions == [path.stem], f"{path.name}: one local function, named as the file"


def test_one_order_of_the_queue_keys_on_both_sides() -> None:
    """keyspace.QUEUE_KEYS, the header of includes/queue_keys.lua and the names it gives are
    the same list in the same order; every script that uses a queue key by name takes them,
    and its own header says which of them it uses."""
    path = lua_dir() / "includes" / "queue_keys.lua"
    head, code = _split(path)
    rows = [re.match(r"-- KEYS\[(\d+)\]\s+(\w+) = (\S+)", line) for line in head]
    listed = [(int(m[1]), m[2], m[3]) for m in rows if m]
    assert [suffix for _, _, suffix in listed] == list(QUEUE_KEYS)
    assert [n for n, _, _ in listed] == list(range(1, len(QUEUE_KEYS) + 1))
    given = re.findall(r"(\w+) = keys\[(\d+)\]", "\n".join(code))
    assert [(int(n), name) for name, n in given] == [(n, name) for n, name, _ in listed]
    names = {name for _, name, _ in listed}
    ks = Keyspace("p")
    assert ks.queue_keys("q") == tuple(f"p:{{q}}:{suffix}" for suffix in QUEUE_KEYS)
    for script in sorted(lua_dir().glob("*.lua")):
        head, code = _split(script)
        code_text, head_text = "\n".join(code), "\n".join(head)
        used = set(re.findall(r"\bq\.(\w+)", code_text))
        assert used <= names, f"{script.name}: no queue key {sorted(used - names)}"
        if used:
            assert "local q = queue_keys(KEYS)" in code_text, script.name
        unsaid = [
            name
            for name in sorted(used)
            if not re.search(rf"\b{name}\b", head_text)
            and not (name.startswith("flows_") and "flows_*" in head_text)
        ]
        assert not unsaid, f"{script.name}: its header does not say it uses {unsaid}"
