"""Names a module re-exports from modules it imports on first access (PEP 562 module
``__getattr__``): how :mod:`echomq_core` defers its asyncio side and
:mod:`echomq_core.wire.connection` its redis-py side, written once."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any


def lazy_names(
    module: str, lazy: dict[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of the module named ``module`` (its ``__name__``):
    each name of ``lazy`` is imported from the module given beside it (relative to the
    module's package) on first access and is then a plain module global, so its import runs
    at most once per name; any other name is an AttributeError naming it."""
    namespace = vars(sys.modules[module])
    package = namespace["__package__"]

    def __getattr__(name: str) -> Any:
        if name not in lazy:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(lazy[name], package), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *lazy})

    return __getattr__, __dir__
