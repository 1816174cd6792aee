"""Every server-side script compiles on a real server and is called by the SHA the registry
computed; every script file has a header naming what it does."""

from __future__ import annotations

from echomq_core.scripts import all_scripts, lua_dir
from echomq_core.server import EmbeddedServer


def test_every_script_loads_under_its_sha(standalone_server: EmbeddedServer) -> None:
    import redis

    client = redis.Redis.from_url(standalone_server.url)
    scripts = all_scripts()
    assert len(scripts) == len(list(lua_dir().glob("*.lua")))
    for script in scripts:
        assert client.script_load(script.source) == script.sha, script.name
        first = script.source.splitlines()[0]
        assert first.startswith("-- "), f"{script.name}: its includes come first, then a header"
    client.close()


def test_every_script_file_opens_with_its_contract() -> None:
    for path in sorted(lua_dir().glob("*.lua")):
        head = path.read_text().splitlines()[0]
        assert head.startswith(f"-- {path.stem}: "), f"{path.name} opens with {head!r}"
