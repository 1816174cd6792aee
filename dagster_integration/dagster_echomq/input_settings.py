"""Per-input read settings: one input waits, reads and closes its flow its own way, through
its input metadata, on the one ``EchoMQIOManager`` of the Definitions.

Using::

    slow = echomq_input(stall_timeout=600, close_after_read=False)

    @asset(ins={"scores": AssetIn(metadata=slow)})
    def audit(scores: dict[str, Any]) -> ...:
        ...

The keys are the IO manager's own reading settings under ``echomq/`` (``echomq/stall_timeout``
...); :func:`echomq_input` writes them, and checks each value where it is called - when the
Definitions load. A hand-written ``AssetIn(metadata={...})`` / ``In(metadata={...})`` is
checked when the input is loaded, before any wait or read: an unknown ``echomq/`` key (a typo
would otherwise be a setting silently not applied) or a bad value is refused with
``InvalidInput`` naming the key. Keys outside ``echomq/`` are the author's and left alone.

Why metadata and not one IO manager key per setting: Dagster hands an IO manager the input's
own metadata (``InputContext.definition_metadata``); a resource key per variant would copy the
connection settings as many times, and a step reading two flows would need two of them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from echomq_core import InvalidInput

PREFIX = "echomq/"


@dataclass(frozen=True, slots=True)
class ReadSettings:
    """How one input waits for, reads and closes its flow (the IO manager's fields of the
    same names, each described there). ``stall_timeout`` None: no stall limit."""

    wait_timeout: float
    stall_timeout: float | None
    poll_interval: float
    log_every: float
    page: int
    close_after_read: bool
    cancel_on_failure: bool
    repair_on_reexecution: bool

    @classmethod
    def of(cls, io_manager: Any) -> ReadSettings:
        """The settings an ``EchoMQIOManager`` is configured with."""
        return cls(**{f.name: getattr(io_manager, f.name) for f in dataclasses.fields(cls)})

    def for_input(self, metadata: Mapping[str, Any] | None, input_name: str) -> ReadSettings:
        """These settings with the input's ``echomq/`` metadata applied, each checked."""
        where = f"input {input_name!r}"
        changes = {
            key[len(PREFIX) :]: _checked(key[len(PREFIX) :], _raw(value), where)
            for key, value in (metadata or {}).items()
            if isinstance(key, str) and key.startswith(PREFIX)
        }
        return dataclasses.replace(self, **changes) if changes else self


#: name -> (what it must be, its check); what is refused is named with the key.
_NUMBER = "a number of seconds > 0"
_KINDS: dict[str, str] = {
    "wait_timeout": _NUMBER,
    "stall_timeout": f"{_NUMBER}, or None (no stall limit)",
    "poll_interval": _NUMBER,
    "log_every": _NUMBER,
    "page": "a whole number > 0 (results per round trip)",
    "close_after_read": "True or False",
    "cancel_on_failure": "True or False",
    "repair_on_reexecution": "True or False",
}


def echomq_input(
    *,
    wait_timeout: float | None = None,
    stall_timeout: float | None = None,
    no_stall_limit: bool = False,
    poll_interval: float | None = None,
    log_every: float | None = None,
    page: int | None = None,
    close_after_read: bool | None = None,
    cancel_on_failure: bool | None = None,
    repair_on_reexecution: bool | None = None,
) -> dict[str, Any]:
    """Input metadata that overrides the IO manager's reading settings for one input (those
    given; the others keep the IO manager's values), each checked now: a bad value raises
    ``InvalidInput`` naming it when the Definitions load. ``no_stall_limit=True``: this input
    waits without a stall limit (children that queue long before a worker takes them)."""
    given = {
        "wait_timeout": wait_timeout,
        "stall_timeout": stall_timeout,
        "poll_interval": poll_interval,
        "log_every": log_every,
        "page": page,
        "close_after_read": close_after_read,
        "cancel_on_failure": cancel_on_failure,
        "repair_on_reexecution": repair_on_reexecution,
    }
    if no_stall_limit and stall_timeout is not None:
        raise InvalidInput("echomq_input: give stall_timeout or no_stall_limit=True, not both")
    meta = {
        PREFIX + name: _checked(name, value, "echomq_input")
        for name, value in given.items()
        if value is not None
    }
    if no_stall_limit:
        meta[PREFIX + "stall_timeout"] = None
    return meta


def _checked(name: str, value: Any, where: str) -> Any:
    key = PREFIX + name
    kind = _KINDS.get(name)
    if kind is None:
        known = ", ".join(PREFIX + k for k in _KINDS)
        raise InvalidInput(f"{where}: unknown EchoMQ input setting {key!r}; known: {known}")
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if name in ("close_after_read", "cancel_on_failure", "repair_on_reexecution"):
        ok = isinstance(value, bool)
    elif name == "page":
        ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
    elif name == "stall_timeout" and value is None:
        ok = True
    else:
        ok = is_number and value > 0 and value == value  # NaN is no timeout
    if not ok:
        raise InvalidInput(f"{where}: {key!r} must be {kind}, got {value!r:.80}")
    return float(value) if is_number and name != "page" else value


def _raw(value: Any) -> Any:
    """Metadata may arrive wrapped (``FloatMetadataValue``) or plain."""
    return getattr(value, "value", value)
