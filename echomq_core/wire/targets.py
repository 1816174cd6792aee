"""Connection URLs: what to connect to, checked before any client is made.

``redis://[user:password@]host:port/db``, ``rediss://`` for TLS, ``unix:///path``; Cluster with
``redis+cluster://`` / ``rediss+cluster://`` or ``?cluster=true`` (or the ``cluster=True``
argument, which wins); ``?migration_wait=S`` (or the ``migration_wait=S`` argument, which wins)
bounds how long a call waits for a Cluster slot being moved (see ``docs/CLUSTER.md``).
Passwords never appear in reprs or error messages. (The dashboard's own URLs are built in
:mod:`echomq_core.seeing.urls`.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from .. import errors
from ..checks import check_seconds

#: How long (s) one step keeps being sent again while its slot is being moved (TRYAGAIN), unless
#: the connection's ``migration_wait`` says otherwise: a reshard of a busy slot, moving its keys
#: in small batches, can take tens of seconds, and the queue's calls wait for the handover.
MIGRATION_WAIT = 60.0
#: The most seconds ``migration_wait`` may be.
MAX_MIGRATION_WAIT = 86400.0

_SCHEMES = {"redis", "rediss", "unix", "redis+cluster", "rediss+cluster"}


@dataclass(frozen=True, slots=True)
class Target:
    """A parsed connection URL: what to connect to, with the password kept out of reprs."""

    url: str  # the URL redis-py gets (EchoMQ's own parameters removed); holds the password
    cluster: bool
    where: str  # host:port/db for messages, never the password
    migration_wait: float | None = None  # ?migration_wait= (seconds), if the URL sets it

    def __repr__(self) -> str:
        return f"Target({self.where}, cluster={self.cluster})"


def parse_url(url: str, *, cluster: bool | None = None) -> Target:
    """Check a URL and decide standalone or Cluster; raise :class:`ConfigurationError`."""
    if not isinstance(url, str) or not url:
        raise errors.ConfigurationError("connection URL must be a non-empty string")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise errors.ConfigurationError(f"malformed connection URL: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in _SCHEMES:
        raise errors.ConfigurationError(
            f"unsupported URL scheme {parts.scheme!r}: use redis://, rediss://, unix://, "
            "redis+cluster:// or rediss+cluster://"
        )
    query = dict(parse_qsl(parts.query))
    flag = (query.pop("cluster", None) or "").lower()
    wait = query.pop("migration_wait", None)
    if flag not in {"", "1", "true", "yes", "0", "false", "no"}:
        raise errors.ConfigurationError(f"cluster= in the URL must be true or false, got {flag!r}")
    is_cluster = scheme.endswith("+cluster") or flag in {"1", "true", "yes"}
    if cluster is not None:
        is_cluster = cluster
    if scheme != "unix" and not parts.hostname:
        raise errors.ConfigurationError("connection URL has no host")
    if scheme == "unix" and not parts.path:
        raise errors.ConfigurationError("unix:// URL has no socket path")
    db = parts.path.lstrip("/")
    if db and scheme != "unix" and not db.isdigit():
        raise errors.ConfigurationError(f"database in URL must be a number, got {db!r}")
    if is_cluster and db not in ("", "0"):
        raise errors.ConfigurationError("a Cluster has only database 0")
    if is_cluster and scheme == "unix":
        raise errors.ConfigurationError("Cluster mode needs host:port URLs, not unix://")
    base = scheme.split("+", 1)[0]
    if base == "unix":  # redis-py wants the "unix://" spelling, which urlunsplit drops
        clean = f"unix://{parts.netloc}{parts.path}" + (f"?{urlencode(query)}" if query else "")
    else:
        clean = urlunsplit((base, parts.netloc, parts.path, urlencode(query), ""))
    where = (
        f"unix:{parts.path}"
        if scheme == "unix"
        else f"{parts.hostname}:{port or 6379}/{db or '0'}{' (cluster)' if is_cluster else ''}"
    )
    return Target(clean, is_cluster, where, None if wait is None else migration_wait(wait))


def migration_wait(value: Any) -> float:
    """A ``migration_wait`` (seconds, from a URL parameter or a keyword argument), checked:
    :class:`ConfigurationError` unless it is a finite number in 0..:data:`MAX_MIGRATION_WAIT`
    (0: a call of a slot being moved fails at its first ``TRYAGAIN``)."""
    number = value
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            number = None
    try:
        return check_seconds("migration_wait", number, 0.0, MAX_MIGRATION_WAIT)
    except errors.InvalidArgument:
        raise errors.ConfigurationError(
            f"migration_wait must be a number of seconds between 0 and {MAX_MIGRATION_WAIT:g}, "
            f"got {value!r:.40}"
        ) from None


def wait_for(target: Target, given: float | None) -> float:
    """The ``migration_wait`` a connection gets: the keyword argument wins over the URL
    parameter, as ``cluster=`` does; else :data:`MIGRATION_WAIT`."""
    if given is not None:
        return migration_wait(given)
    return MIGRATION_WAIT if target.migration_wait is None else target.migration_wait
