"""docs/layout.md names every module of ``echomq_core``, each in the room it lives in, and no
module that is not there: the page a newcomer reads first is the tree as it is."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORE = ROOT / "echomq_core"


def listed() -> dict[str, set[str]]:
    """Room (``""`` for the package itself) to the module files the page names in it."""
    page = (ROOT / "docs" / "layout.md").read_text()
    block = page.split("\n## Layout\n", 1)[1].split("```\n", 2)[1]
    rooms: dict[str, set[str]] = {}
    room: str | None = None
    for line in block.splitlines():
        top = re.match(r"^(\s*)([\w]+)/\s", line + " ")
        if top and top.group(2) == "echomq_core" and not top.group(1):
            room = ""
        elif top and len(top.group(1)) == 2 and room is not None:
            room = top.group(2)
        elif line and not line.startswith(" "):
            room = None  # lua/, tests/, ...: not the package
        if room is not None:
            text = line if not top else line[top.end() - 1 :]
            rooms.setdefault(room, set()).update(re.findall(r"\b(\w+\.py)\b", text))
    return rooms


def actual() -> dict[str, set[str]]:
    rooms: dict[str, set[str]] = {"": {p.name for p in CORE.glob("*.py")}}
    for folder in sorted(p for p in CORE.iterdir() if (p / "__init__.py").is_file()):
        rooms[folder.name] = {p.name for p in folder.glob("*.py")} - {"__init__.py"}
    return rooms


def test_the_layout_page_is_the_tree() -> None:
    page, tree = listed(), actual()
    assert set(page) == set(tree), f"rooms on the page {sorted(page)}, in the tree {sorted(tree)}"
    for room, modules in tree.items():
        name = f"echomq_core/{room}/" if room else "echomq_core/"
        missing, extra = modules - page[room], page[room] - modules - {"__init__.py"}
        assert not missing, f"{name}: not on docs/layout.md: {sorted(missing)}"
        assert not extra, f"{name}: on docs/layout.md but not in the tree: {sorted(extra)}"


def test_no_room_is_nested_deeper() -> None:
    """A room is one folder: a module two floors down would be a room the page cannot show."""
    deep = [p for p in CORE.glob("*/*/*.py")]
    assert not deep, deep


def test_every_room_says_what_lives_there() -> None:
    for folder in CORE.iterdir():
        init = folder / "__init__.py"
        if init.is_file():
            text = init.read_text()
            assert text.startswith('"""') and len(text) > 40, f"{init}: no docstring"


RUNTIME = (
    CORE,
    ROOT / "airflow_provider" / "echomq_provider",
    ROOT / "dagster_integration" / "dagster_echomq",
)
#: The most lines of a runtime module, and of one function (its docstring included).
MODULE_LINES, FUNCTION_LINES = 500, 80


def test_no_runtime_module_or_function_is_too_long_to_read() -> None:
    import ast

    too_long: list[str] = []
    for base in RUNTIME:
        for path in sorted(base.rglob("*.py")):
            text = path.read_text()
            name = path.relative_to(ROOT)
            if text.count("\n") > MODULE_LINES:
                too_long.append(f"{name}: {text.count(chr(10))} lines")
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    lines = (node.end_lineno or node.lineno) - node.lineno + 1
                    if lines > FUNCTION_LINES:
                        too_long.append(f"{name}:{node.lineno} {node.name}: {lines} lines")
    assert not too_long, "\n".join(too_long)
