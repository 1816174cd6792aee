"""The dashboard tests' fixtures, defined once in ``tests/dashkit.py`` (the browser tests
share them): ``client``, ``scenario``, ``open_dashboard``, ``readonly`` and ``actions`` on the
standalone server, ``dashboard`` on the test's backend."""

from ..dashkit import actions, client, dashboard, open_dashboard, readonly, scenario

__all__ = ["actions", "client", "dashboard", "open_dashboard", "readonly", "scenario"]
