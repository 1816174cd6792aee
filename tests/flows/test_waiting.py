"""The tests' one way to wait (tests/waiting.py): it returns what the condition returned, and
fails naming what it waited for, with the state at that moment."""

from __future__ import annotations

import asyncio

import pytest

from ..waiting import eventually, eventually_async


def test_eventually_returns_the_first_truthy_value() -> None:
    values = iter([0, None, [], 7, 8])
    assert eventually(lambda: next(values), 5, "a value", every=0) == 7


def test_eventually_fails_naming_what_it_waited_for() -> None:
    polls: list[int] = []
    with pytest.raises(AssertionError, match=r"timed out after 0.05 s waiting for 3 polls: \d+"):
        eventually(lambda: polls.append(1), 0.05, lambda: f"3 polls: {len(polls)}", every=0.01)
    assert len(polls) >= 2  # polled until the deadline, not once


def test_eventually_async_lets_the_loop_run() -> None:
    async def main() -> str:
        done: list[str] = []
        asyncio.get_running_loop().call_later(0.05, done.append, "ran")
        return (await eventually_async(lambda: done, 5, "the callback", every=0.01))[0]

    assert asyncio.run(main()) == "ran"
