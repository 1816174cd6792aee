"""A node's success threshold (``min_success``): how many of its children may die without
failing it (:func:`allowance`), and the threshold as the server keeps it (:func:`requirement`)."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

from ..errors import InvalidArgument


def allowance(where: str, min_success: Any, n: int) -> int | None:
    """How many of a node's ``n`` children may die without failing it, for ``min_success``: a
    fraction in (0, 1] (``ceil(min_success * n)`` must succeed, read as the decimal it is
    written as, so ``0.99`` of 200,000 requires 198,000), or an int count in 1..n; None for
    no threshold. :class:`InvalidArgument` naming the value otherwise (a bool, a string, a
    fraction outside (0, 1], a count above ``n`` or below 1)."""
    if min_success is None:
        return None
    if isinstance(min_success, bool) or not isinstance(min_success, int | float):
        raise InvalidArgument(
            f"{where}: min_success must be a fraction in (0, 1] or an int count of children, "
            f"got {min_success!r:.80}"
        )
    if isinstance(min_success, int):
        if not 1 <= min_success <= n:
            raise InvalidArgument(
                f"{where}: min_success={min_success!r} is a count of children: it must be "
                f"between 1 and the {n} children"
            )
        return n - min_success
    if not 0 < min_success <= 1:  # NaN fails this too
        raise InvalidArgument(
            f"{where}: min_success={min_success!r} is a fraction: it must be in (0, 1] "
            "(an int is a count of children)"
        )
    required = math.ceil(Fraction(str(min_success)) * n)
    return n - max(1, required)


def requirement(min_success: Any) -> str:
    """A valid ``min_success`` (see :func:`allowance`) as the server keeps it, to apply it
    again when the flow grows (spawn.lua): a count ``"<c>"`` or the exact decimal fraction
    ``"<p>/<q>"``."""
    if isinstance(min_success, int):
        return str(min_success)
    exact = Fraction(str(min_success))
    return f"{exact.numerator}/{exact.denominator}"
