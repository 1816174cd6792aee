"""An Airflow connection of type ``echomq``, read into the arguments of an EchoMQ client.

The connection's standard fields carry the server (host, port, login as the ACL user,
password, and ``schema`` as the database number, so the URI form reads naturally:
``echomq://:secret@redis.internal:6379/0?prefix=etl&tls=true``). Its extras carry the rest:

==================  =========  =============================================================
extra               default    meaning
==================  =========  =============================================================
``prefix``          ``emq``    the key prefix, so several EchoMQ keyspaces share a server
``tls``             false      connect with TLS (``rediss://``)
``cluster``         false      the server is a Redis Cluster (``redis+cluster://``)
``ssl_cert_reqs``   required   TLS certificate check: ``required``, ``optional`` or ``none``
``ssl_ca_certs``    (system)   path of a CA bundle for TLS
==================  =========  =============================================================

Extras arrive as JSON values from the UI and as strings from a URI's query, so booleans
accept both (``true``/``false``, ``1``/``0``, ``yes``/``no``). An unknown extra is refused by
name: a misspelt ``clustr`` silently ignored would connect to the wrong topology.

The password stays out of every repr and log line: :attr:`where` is what messages show;
:attr:`url` (which holds it) goes only to the client constructor.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import quote

from echomq_core import ConfigurationError

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 6379
DEFAULT_PREFIX = "emq"
CERT_REQS = ("required", "optional", "none")
KNOWN_EXTRAS = ("prefix", "tls", "cluster", "ssl_cert_reqs", "ssl_ca_certs")
_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off", ""}


class ConnectionFields(Protocol):
    """The standard fields of an Airflow connection (``airflow.sdk.Connection`` has them)."""

    conn_id: str
    host: str | None
    port: int | None
    login: str | None
    password: str | None
    schema: str | None


@dataclass(frozen=True, slots=True)
class EchoMQConnectionSettings:
    """Everything an :class:`~echomq_core.EchoMQ` client needs from one connection."""

    conn_id: str
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    db: int = 0
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    tls: bool = False
    cluster: bool = False
    prefix: str = DEFAULT_PREFIX
    ssl_cert_reqs: str = "required"
    ssl_ca_certs: str | None = None

    @classmethod
    def from_connection(
        cls, conn: ConnectionFields, extra: Mapping[str, Any], *, prefix: str | None = None
    ) -> EchoMQConnectionSettings:
        """Read ``conn`` and its already-parsed ``extra``; ``prefix`` overrides the extra.

        ``extra`` is passed in rather than read here so that the async path can parse it with
        ``aextra_dejson()`` (the sync ``extra_dejson`` masks secrets through a blocking call,
        which deadlocks inside the triggerer's event loop).
        """
        options = _unprefixed(conn.conn_id, extra)
        unknown = sorted(set(options) - set(KNOWN_EXTRAS))
        if unknown:
            raise ConfigurationError(
                f"connection {conn.conn_id!r}: unknown extra {', '.join(map(repr, unknown))}; "
                f"known: {', '.join(KNOWN_EXTRAS)}"
            )
        cert_reqs = str(options.get("ssl_cert_reqs") or "required").lower()
        if cert_reqs not in CERT_REQS:
            raise ConfigurationError(
                f"connection {conn.conn_id!r}: ssl_cert_reqs must be one of "
                f"{', '.join(CERT_REQS)}, got {cert_reqs!r}"
            )
        settings = cls(
            conn_id=conn.conn_id,
            host=conn.host or DEFAULT_HOST,
            port=_port(conn.conn_id, conn.port),
            db=_db(conn.conn_id, conn.schema),
            username=conn.login or None,
            password=conn.password or None,
            tls=_flag(conn.conn_id, "tls", options.get("tls")),
            cluster=_flag(conn.conn_id, "cluster", options.get("cluster")),
            prefix=prefix or str(options.get("prefix") or DEFAULT_PREFIX),
            ssl_cert_reqs=cert_reqs,
            ssl_ca_certs=str(options["ssl_ca_certs"]) if options.get("ssl_ca_certs") else None,
        )
        if settings.cluster and settings.db:
            raise ConfigurationError(f"connection {conn.conn_id!r}: a Cluster has only database 0")
        return settings

    @property
    def where(self) -> str:
        """``host:port/db``, for messages; never the password."""
        return (
            f"{self.host}:{self.port}/{self.db}{' (tls)' if self.tls else ''}"
            f"{' (cluster)' if self.cluster else ''}"
        )

    @property
    def url(self) -> str:
        """The client URL. Holds the password: hand it to the client, never to a log."""
        scheme = ("rediss" if self.tls else "redis") + ("+cluster" if self.cluster else "")
        auth = ""
        if self.username or self.password:
            auth = quote(self.username or "", safe="")
            if self.password:
                auth += ":" + quote(self.password, safe="")
            auth += "@"
        host = f"[{self.host}]" if ":" in self.host else self.host
        path = "" if self.cluster else f"/{self.db}"
        return f"{scheme}://{auth}{host}:{self.port}{path}"

    def client_options(self) -> dict[str, Any]:
        """Keyword arguments for the redis-py client under EchoMQ (TLS settings only)."""
        if not self.tls:
            return {}
        options: dict[str, Any] = {"ssl_cert_reqs": self.ssl_cert_reqs}
        if self.ssl_ca_certs:
            options["ssl_ca_certs"] = self.ssl_ca_certs
        return options


def _unprefixed(conn_id: str, extra: Mapping[str, Any]) -> dict[str, Any]:
    """Accept both ``prefix`` and the form's older ``extra__echomq__prefix`` spelling."""
    if not isinstance(extra, Mapping):
        raise ConfigurationError(f"connection {conn_id!r}: extra must be a JSON object")
    out: dict[str, Any] = {}
    for key, value in extra.items():
        name = key.removeprefix("extra__echomq__")
        if value is not None:
            out[name] = value
    return out


def _flag(conn_id: str, name: str, value: Any) -> bool:
    if value is None or isinstance(value, bool):
        return bool(value)
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ConfigurationError(
        f"connection {conn_id!r}: extra {name!r} must be a boolean, got {value!r}"
    )


def _port(conn_id: str, port: Any) -> int:
    if port in (None, ""):
        return DEFAULT_PORT
    try:
        number = int(port)
    except (TypeError, ValueError):
        raise ConfigurationError(f"connection {conn_id!r}: port must be a number") from None
    if not 0 < number < 65536:
        raise ConfigurationError(f"connection {conn_id!r}: port {number} is out of range")
    return number


def _db(conn_id: str, schema: str | None) -> int:
    if not schema:
        return 0
    if not str(schema).isdigit():
        raise ConfigurationError(
            f"connection {conn_id!r}: the database (schema field) must be a number, got {schema!r}"
        )
    return int(schema)
