"""The provider's own errors, in EchoMQ's tree (:class:`echomq_core.EchoMQError`).

Everything else the provider raises is Airflow's (``AirflowFailException`` and friends, which
carry these as their cause) or EchoMQ's own.
"""

from __future__ import annotations

from echomq_core import EchoMQError, InvalidArgument


class TooManyValues(InvalidArgument):
    """Raised when a waiting task asked to return every value (``return_values=True``) has a
    flow (or, the waiting operator, a plan: then before anything is added) of more than
    ``max_values`` children: raise ``max_values``, or read them page by page instead
    (:func:`echomq_provider.results.flow_results`). It fails the reader, never the flow."""


class FlowNotReleased(EchoMQError):
    """Raised when results are read from a flow whose children have not all settled yet
    (read them downstream of the sensor)."""
