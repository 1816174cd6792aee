"""The browser tests' fixtures: headless Chromium for a test module, where screenshots go,
and the dashboard fixtures of ``tests/dashkit.py`` (``client``, ``scenario``,
``open_dashboard``, ``readonly``, ``actions``), shared with tests/seeing."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..dashkit import actions, client, open_dashboard, readonly, scenario
from .cdp import Browser

__all__ = ["actions", "browser", "client", "open_dashboard", "readonly", "scenario", "shots"]


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    b = Browser()
    yield b
    b.close()


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    """Where a test writes its screenshots: ``$ECHOMQ_SCREENSHOTS``, or its temporary folder."""
    wanted = os.environ.get("ECHOMQ_SCREENSHOTS")
    return Path(wanted).resolve() if wanted else tmp_path
