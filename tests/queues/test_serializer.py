"""The default serializer (``JsonSerializer``): the bytes ``json.dumps`` gives, compact and
without NaN, through the C encoder it keeps for the process, and a typed error for anything
JSON cannot carry."""

from __future__ import annotations

import enum
import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from echomq_core.errors import InvalidPayload
from echomq_core.models import JsonSerializer

from ..test_hostile_input import _deep

SER = JsonSerializer()

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(), inner, max_size=5),
    max_leaves=30,
)


def reference(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), allow_nan=False).encode()


class Colour(enum.IntEnum):
    RED = 1


@settings(max_examples=300, deadline=None)
@given(JSON)
def test_dumps_gives_the_bytes_of_json_dumps(value: Any) -> None:
    assert SER.dumps(value) == reference(value)
    assert SER.loads(SER.dumps(value)) == value or value != value


@pytest.mark.parametrize(
    "value",
    [
        {"i": 1, "name": "é", "nested": [1.5, None, True, {"k": 'a"b\\\n'}]},
        (1, 2),  # a tuple, as a list
        Colour.RED,  # an int subclass, as its int
        {1: "int key", 2.5: "float key", None: "none", False: "bool"},
        "\u2028 \ud7ff \U0001f600",
        [[[[[]]]]],
        10**30,
        -0.0,
        1e-300,
    ],
)
def test_the_values_json_dumps_takes_come_out_the_same(value: Any) -> None:
    assert SER.dumps(value) == reference(value)


def test_without_the_c_encoder_the_bytes_are_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    value = {"a": [1, "b", {"c": None}], "d": 2.5}
    fast = SER.dumps(value)
    monkeypatch.setattr(JsonSerializer, "_one_shot", None)
    assert SER.dumps(value) == fast == reference(value)


def _contains_itself() -> list[Any]:
    loop: list[Any] = []
    loop.append({"again": loop})
    return loop


@pytest.mark.parametrize(
    ("value", "named"),
    [
        (math.nan, "Out of range float"),
        (math.inf, "Out of range float"),
        ({1, 2}, "set"),
        (object(), "object"),
        ({(1, 2): 3}, "keys must be"),
        (_contains_itself(), "contains itself"),
        (_deep(100_000), "contains itself, or nests deeper"),
    ],
)
def test_what_json_cannot_carry_is_refused_by_name(value: Any, named: str) -> None:
    with pytest.raises(InvalidPayload, match="not JSON-serialisable") as err:
        SER.dumps(value)
    assert named in str(err.value)
    # the encoder is the process's: one error leaves nothing behind for the next value
    assert SER.dumps([1, [2]]) == b"[1,[2]]"
