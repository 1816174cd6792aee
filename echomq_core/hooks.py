"""Plugins: lifecycle hooks and handler discovery, through pluggy.

Using::

    # my_plugin.py
    from echomq_core.hooks import hookimpl

    @hookimpl
    def echomq_flow_released(queue, parent_id, client):
        print("released", queue, parent_id, client.dependencies(queue, parent_id))

    @hookimpl
    def echomq_handlers():
        return {"thumbnails": make_thumbnail}

    # pyproject.toml of the plugin's distribution
    [project.entry-points."echomq.plugins"]
    my_plugin = "my_plugin"

``echomq worker`` and ``echomq pump`` load every plugin of the ``echomq.plugins`` entry point
group. In code, build the manager yourself and hand the adapter to the Worker and the Pump::

    pm = plugin_manager(MyPlugin(), entry_points=False)
    hooks = Hooks(pm, client=mq)
    Worker(mq, hooks.handlers(), hooks=hooks).start()
    Pump(mq, hooks=hooks).start()

An implementation may take any subset of a hook's arguments (pluggy's rule), so a hook can
grow an argument without breaking plugins.

Where the lifecycle hooks fire: in the worker and Pump processes, after the script that
made the change returned - never inside Lua. Each fires once per change the server accepted
(a stale completion, a redelivered signal or a second release changes nothing and fires
nothing). They are notifications, not a durable log: a process killed between the script
and the hook loses that call; the state itself is on the server (read it with
``EchoMQ.snapshot`` and friends).

Why each implementation is called on its own (instead of one pluggy hook call): pluggy stops
a call at the first implementation that raises, so one broken plugin would silently starve
the others. Here an implementation that raises is logged with its plugin name and the next
one still runs; the worker or Pump carries on. Consequences: lifecycle hooks take no
``wrapper``/``hookwrapper`` implementations (they are skipped with a warning), and
implementations must be thread-safe and quick - a worker calls them on its runner threads,
between a batch's completion and its next claim (hand slow work to a queue of your own).
"""

from __future__ import annotations

import importlib.metadata
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal, Protocol

import pluggy

from .errors import ConfigurationError
from .models import Job, JsonSerializer, Serializer
from .wire.keyspace import check_queue

if TYPE_CHECKING:
    from .client.clients import EchoMQ

log = logging.getLogger(__name__)

PROJECT = "echomq"
#: The entry point group plugins declare themselves in.
ENTRY_POINT_GROUP = "echomq.plugins"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

Handler = Callable[[Job], Any]


class HookSpecs:
    """The hook specifications. ``client`` is the :class:`~echomq_core.EchoMQ` the worker or
    Pump runs on (None when the adapter was built without one), for plugins that read flows."""

    @hookspec
    def echomq_job_completed(self, job: Job, result: Any, client: EchoMQ | None) -> None:
        """A job's completion was recorded (its lease was current). ``result`` is the value as
        stored, decoded with the client's serializer. Fired by the worker, once per accepted
        completion; a run whose completion was refused (lease lost) fires nothing."""

    @hookspec
    def echomq_job_dead(self, job: Job, error: str, client: EchoMQ | None) -> None:
        """A job failed its last attempt (or raised ``Unrecoverable``) and moved to ``dead``.
        ``error`` is the recorded error text. Fired by the worker, and by the Pump for a job
        it buries after more than ``max_stalls`` expired leases (its ``token`` is then '':
        nobody holds the job any more)."""

    @hookspec
    def echomq_flow_released(self, queue: str, parent_id: str, client: EchoMQ | None) -> None:
        """A flow's last outstanding child settled and the parent (in ``queue``) moved from
        ``held`` to ``pending``. Fired by the worker when the last child lived in the parent's
        queue, by the Pump when it delivered the last cross-queue signal - exactly one of them,
        once per flow."""

    @hookspec
    def echomq_flow_failed(self, queue: str, parent_id: str, client: EchoMQ | None) -> None:
        """A fail-the-parent child died and the parent moved to ``failed`` (it will never run).
        Read the culprits with ``client.failed_children(queue, parent_id)``. Fired once per
        flow, by the worker (same-queue child) or the Pump (cross-queue child)."""

    @hookspec
    def echomq_signal_poisoned(self, queue: str, reason: str, client: EchoMQ | None) -> None:
        """The Pump moved a fan-in signal it could not deliver (malformed, or its parent is
        gone) from ``queue``'s outbox to its poison list, with ``reason``. Inspect and replay
        with ``echomq poison list|replay QUEUE``. Fired by the Pump."""

    @hookspec
    def echomq_handlers(self, client: EchoMQ | None) -> Mapping[str, Handler] | None:
        """Return {queue name: handler} for ``echomq worker`` to run. Called once at worker
        start; two plugins claiming one queue is a configuration error."""


def plugin_manager(*plugins: object, entry_points: bool = True) -> pluggy.PluginManager:
    """A :class:`pluggy.PluginManager` with EchoMQ's hook specs, the plugins found through the
    ``echomq.plugins`` entry point group (unless ``entry_points=False``) and ``plugins``.

    Raises :class:`ConfigurationError` naming the plugin when one fails to import, or
    implements a hook that does not exist (``echomq_*`` typos are caught here, at start).
    """
    pm = pluggy.PluginManager(PROJECT)
    pm.add_hookspecs(HookSpecs)
    try:
        if entry_points:
            for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
                if pm.has_plugin(ep.name) or pm.is_blocked(ep.name):
                    continue
                try:
                    obj = ep.load()
                except Exception as exc:
                    raise ConfigurationError(
                        f"echomq plugin {ep.name!r} ({ep.value}) failed to load: "
                        f"{type(exc).__name__}: {exc}"
                    ) from exc
                pm.register(obj, name=ep.name)
        for plugin in plugins:
            if not pm.is_registered(plugin):  # e.g. also found through its entry point
                pm.register(plugin)
        pm.check_pending()
    except (pluggy.PluginValidationError, ValueError) as exc:
        if isinstance(exc, ConfigurationError):
            raise
        raise ConfigurationError(f"invalid echomq plugin: {exc}") from exc
    return pm


class LifecycleHooks(Protocol):
    """What the :class:`~echomq_core.Worker` and the :class:`~echomq_core.Pump` call
    (``hooks=``), one method per event, always with keyword arguments. :class:`Hooks` is the
    implementation that dispatches to plugins; any object with these methods will do."""

    def job_completed(self, *, job: Job, result: bytes) -> None: ...

    def job_dead(self, *, job: Job, error: str) -> None: ...

    def flow_released(self, *, queue: str, parent_id: str) -> None: ...

    def flow_failed(self, *, queue: str, parent_id: str) -> None: ...

    def signal_poisoned(self, *, queue: str, reason: str) -> None: ...


#: The lifecycle events, by the name of their :class:`LifecycleHooks` method.
Event = Literal["job_completed", "job_dead", "flow_released", "flow_failed", "signal_poisoned"]


def fire(hooks: LifecycleHooks, event: Event, **kwargs: Any) -> None:
    """Call one event's method on ``hooks`` (the Worker's and the Pump's one way to do it): what
    it raises is logged, never raised, and an object without that method skips the event, so a
    hook can never stop a worker or a Pump."""
    method = getattr(hooks, event, None)
    if method is None:
        return
    try:
        method(**kwargs)
    except Exception:
        log.exception("hook %s raised; ignored", event)


class Hooks:
    """The adapter the :class:`~echomq_core.Worker` and :class:`~echomq_core.Pump` call
    (``hooks=``): one method per lifecycle event, each calling every implementation on its
    own and logging (never raising) what an implementation raises."""

    def __init__(
        self, pm: pluggy.PluginManager | None = None, *, client: EchoMQ | None = None
    ) -> None:
        self.pm = pm if pm is not None else plugin_manager()
        self.client = client
        self.serializer: Serializer = client.serializer if client is not None else JsonSerializer()
        self._warned: set[int] = set()

    def __repr__(self) -> str:
        return f"Hooks(plugins={self.plugin_names()})"

    def plugin_names(self) -> list[str]:
        """Names of the registered plugins (entry point names, or pluggy's for objects)."""
        return sorted(str(self.pm.get_name(p)) for p in self.pm.get_plugins())

    # -- lifecycle events (called by the worker and the Pump) -----------------------------
    def job_completed(self, *, job: Job, result: bytes) -> None:
        """``result`` is the stored (serialised) result: decoded once, only when a plugin
        listens."""
        impls = self._impls("echomq_job_completed")
        if not impls:
            return
        try:
            value = self.serializer.loads(result)
        except Exception as exc:
            log.warning(
                "job_completed: result of %s cannot be decoded (%s); passing bytes", job.id, exc
            )
            value = result
        self._call(impls, "echomq_job_completed", job=job, result=value)

    def job_dead(self, *, job: Job, error: str) -> None:
        self._fire("echomq_job_dead", job=job, error=error)

    def flow_released(self, *, queue: str, parent_id: str) -> None:
        self._fire("echomq_flow_released", queue=queue, parent_id=parent_id)

    def flow_failed(self, *, queue: str, parent_id: str) -> None:
        self._fire("echomq_flow_failed", queue=queue, parent_id=parent_id)

    def signal_poisoned(self, *, queue: str, reason: str) -> None:
        self._fire("echomq_signal_poisoned", queue=queue, reason=reason)

    # -- handler discovery ----------------------------------------------------------------
    def handlers(self) -> dict[str, Handler]:
        """Every plugin's ``echomq_handlers`` merged; raises :class:`ConfigurationError` when
        a plugin returns something else than a mapping of queue names to callables, or two
        plugins claim one queue. A plugin that raises here is an error too: better to refuse
        to start than to run without a handler."""
        out: dict[str, Handler] = {}
        owner: dict[str, str] = {}
        for impl in reversed(self.pm.hook.echomq_handlers.get_hookimpls()):
            try:
                got = impl.function(*self._args(impl, {}))
            except Exception as exc:
                raise ConfigurationError(
                    f"echomq plugin {impl.plugin_name!r}: echomq_handlers "
                    f"raised {type(exc).__name__}: {exc}"
                ) from exc
            if got is None:
                continue
            if not isinstance(got, Mapping):
                raise ConfigurationError(
                    f"echomq plugin {impl.plugin_name!r}: echomq_handlers "
                    f"returned {type(got).__name__}, not a mapping"
                )
            for queue, fn in got.items():
                check_queue(queue)
                if not callable(fn):
                    raise ConfigurationError(
                        f"echomq plugin {impl.plugin_name!r}: handler for {queue!r} is not callable"
                    )
                if queue in out:
                    raise ConfigurationError(
                        f"queue {queue!r} has handlers from plugins "
                        f"{owner[queue]!r} and {impl.plugin_name!r}"
                    )
                out[queue], owner[queue] = fn, impl.plugin_name
        return out

    # -- calling ---------------------------------------------------------------------------
    def _impls(self, name: str) -> list[pluggy.HookImpl]:
        impls = []
        # pluggy calls the last registered first (tryfirst/trylast already applied): same here
        for impl in reversed(getattr(self.pm.hook, name).get_hookimpls()):
            if impl.hookwrapper or impl.wrapper:
                if id(impl) not in self._warned:
                    self._warned.add(id(impl))
                    log.warning(
                        "echomq plugin %r: wrappers are not supported on %s; skipped",
                        impl.plugin_name,
                        name,
                    )
                continue
            impls.append(impl)
        return impls

    def _fire(self, name: str, **kwargs: Any) -> None:
        impls = self._impls(name)
        if impls:
            self._call(impls, name, **kwargs)

    def _call(self, impls: list[pluggy.HookImpl], name: str, **kwargs: Any) -> None:
        for impl in impls:
            try:
                impl.function(*self._args(impl, kwargs))
            except Exception:
                log.exception("echomq plugin %r raised in %s; ignored", impl.plugin_name, name)

    def _args(self, impl: pluggy.HookImpl, kwargs: dict[str, Any]) -> list[Any]:
        # An implementation names the subset of the spec's arguments it wants, in its order.
        given = {**kwargs, "client": self.client}
        return [given[arg] for arg in impl.argnames]
