"""Faults on one embedded server, for the tests: a crash (SIGKILL) and a restart on the same
port and data.

Test harness, not runtime: users run :class:`echomq_core.server.EmbeddedServer` (start, stop);
crashing it and bringing it back are what the tests do to it (the wheel does not ship this
module).
"""

from __future__ import annotations

from echomq_core.server import EmbeddedServer


def kill(server: EmbeddedServer) -> None:
    """SIGKILL ``server`` to simulate a crash; its data_dir is kept, so :func:`restart` finds
    the AOF. A no-op once stopped."""
    server._kill()


def restart(server: EmbeddedServer, timeout: float = 10.0) -> None:
    """Start ``server`` again on the same port and data_dir (stopping it gracefully first if
    it runs)."""
    server._shutdown_process(timeout)
    server.start(timeout)
