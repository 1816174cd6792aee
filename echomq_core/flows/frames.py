"""A flow's results as a data frame: pandas, polars or an Arrow table, built page by page.

Using::

    frame = results_frame(mq.iter_children_values("q", parent_id), "polars")

The frame has one row per completed child: a key column (``child_id`` unless named) and the
child's value - a mapping's keys as columns (a key missing from a row is null there), anything
else in one ``value`` column. Column types are inferred by the frame library from the values
(JSON's numbers, strings, booleans, nulls; lists and mappings nested in a value stay nested).

Invariants:

* **Bounded memory.** The rows are read ``page`` at a time; each page becomes a frame chunk
  before the next is read, so the Python objects of at most one page are alive beside the
  columnar result. Arrow and polars join the chunks without copying them (a chunked table, a
  frame of several chunks); pandas copies once when it concatenates.
* **Nothing is guessed.** A value whose mapping holds the key column's name, or whose keys are
  not all strings, is refused with :class:`~echomq_core.errors.InvalidInput` naming the child;
  an unknown kind with :class:`~echomq_core.errors.InvalidArgument`; a frame library that is
  not installed with :class:`~echomq_core.errors.ConfigurationError` naming the extra that
  installs it.
* The libraries are imported only when a frame of their kind is built: defining flows or
  reading results as dicts loads none of them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from functools import partial
from itertools import islice
from typing import Any

from ..errors import ConfigurationError, InvalidArgument, InvalidInput

#: The kinds of frame, each with the module it needs and the extra that installs it.
KINDS: dict[str, tuple[str, str]] = {
    "pandas": ("pandas", "pandas"),
    "polars": ("polars", "polars"),
    "arrow": ("pyarrow", "arrow"),
}
#: Rows turned into one frame chunk at a time.
DEFAULT_PAGE = 10_000
#: The key column's name unless the caller names another.
KEY = "child_id"
#: The column of a value that is not a mapping.
VALUE = "value"


def check_kind(kind: Any) -> str:
    """``kind`` if it names a frame library (see :data:`KINDS`), else
    :class:`InvalidArgument`. Does not import the library."""
    if not isinstance(kind, str) or kind not in KINDS:
        raise InvalidArgument(
            f"frame kind must be one of {', '.join(map(repr, KINDS))}, got {kind!r:.100}"
        )
    return kind


def library(kind: str) -> Any:
    """The frame library of ``kind``, imported; :class:`ConfigurationError` naming the extra to
    install when it is missing."""
    module, extra = KINDS[check_kind(kind)]
    try:
        return importlib.import_module(module)
    except ImportError as missing:
        raise ConfigurationError(
            f"a {kind} frame needs {module}, which is not installed: pip install 'echomq[{extra}]'"
        ) from missing


def results_frame(
    pairs: Iterable[tuple[Any, Any]],
    kind: str,
    *,
    key: str = KEY,
    page: int = DEFAULT_PAGE,
) -> Any:
    """``(child, value)`` pairs as a frame of ``kind`` (see the module doc)."""
    lib = library(kind)
    if not isinstance(key, str) or not key:
        raise InvalidArgument(f"key must be a non-empty column name, got {key!r:.100}")
    if isinstance(page, bool) or not isinstance(page, int) or page < 1:
        raise InvalidArgument(f"page must be a whole number > 0, got {page!r:.100}")
    build, join = _BUILDERS[kind], _JOINS[kind]
    chunks = [_typed(kind, partial(build, lib, rows)) for rows in _pages(pairs, key, page)]
    return _typed(kind, partial(join, lib, chunks, key))


def _typed(kind: str, step: Callable[[], Any]) -> Any:
    """``step()``, the frame library's refusal of the values (a column mixing types it cannot
    join, say) raised as :class:`InvalidInput` with the library's own words."""
    try:
        return step()
    except InvalidInput:
        raise
    except Exception as refused:
        raise InvalidInput(
            f"the results cannot make a {kind} frame: {type(refused).__name__}: {refused}"
        ) from refused


def _pages(pairs: Iterable[tuple[Any, Any]], key: str, page: int) -> Iterator[list[dict[str, Any]]]:
    it = iter(pairs)
    while True:
        rows = [_row(child, value, key) for child, value in islice(it, page)]
        if not rows:
            return
        yield rows


def _row(child: Any, value: Any, key: str) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        return {key: child, VALUE: value}
    if key in value:
        raise InvalidInput(
            f"child {child!r:.200}: its value has a field {key!r}, the name of the key column; "
            "name another key column (key=...)"
        )
    for name in value:
        if not isinstance(name, str):
            raise InvalidInput(
                f"child {child!r:.200}: its value has a field named {name!r:.100}, not a string; "
                "a frame's columns are named by strings"
            )
    return {key: child, **value}


def _pandas_chunk(pd: Any, rows: list[dict[str, Any]]) -> Any:
    return pd.DataFrame.from_records(rows)


def _pandas_join(pd: Any, chunks: list[Any], key: str) -> Any:
    if not chunks:
        return pd.DataFrame({key: []})
    if len(chunks) == 1:
        return chunks[0]
    return pd.concat(chunks, ignore_index=True)


def _polars_chunk(pl: Any, rows: list[dict[str, Any]]) -> Any:
    # every row of the page sets the schema (a field first seen late in the page is kept)
    return pl.from_dicts(rows, infer_schema_length=None)


def _polars_join(pl: Any, chunks: list[Any], key: str) -> Any:
    if not chunks:
        return pl.DataFrame({key: []})
    # columns a page lacks are null there; types that differ between pages are widened
    return pl.concat(chunks, how="diagonal_relaxed", rechunk=False)


def _arrow_chunk(pa: Any, rows: list[dict[str, Any]]) -> Any:
    # by column, so that every row's fields are columns (from_pylist takes the first row's)
    names = dict.fromkeys(name for row in rows for name in row)
    return pa.table({name: [row.get(name) for row in rows] for name in names})


def _arrow_join(pa: Any, chunks: list[Any], key: str) -> Any:
    if not chunks:
        return pa.table({key: pa.array([], type=pa.null())})
    return pa.concat_tables(chunks, promote_options="permissive")


_BUILDERS: dict[str, Callable[[Any, list[dict[str, Any]]], Any]] = {
    "pandas": _pandas_chunk,
    "polars": _polars_chunk,
    "arrow": _arrow_chunk,
}
_JOINS: dict[str, Callable[[Any, list[Any], str], Any]] = {
    "pandas": _pandas_join,
    "polars": _polars_join,
    "arrow": _arrow_join,
}
