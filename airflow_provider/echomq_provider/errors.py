"""The provider's own errors, in EchoMQ's tree (:class:`echomq_core.EchoMQError`).

Everything else the provider raises is Airflow's (``AirflowFailException`` and friends, which
carry these as their cause) or EchoMQ's own.
"""

from __future__ import annotations

from echomq_core import EchoMQError, InvalidArgument

from ._compat import AirflowNotFoundException


class TooManyValues(InvalidArgument):
    """Raised when a waiting task asked to return every value (``return_values=True``) has a
    flow (or, the waiting operator, a plan: then before anything is added) of more than
    ``max_values`` children: raise ``max_values``, or read them page by page instead
    (:func:`echomq_provider.results.flow_results`). It fails the reader, never the flow."""


class FlowNotReleased(EchoMQError):
    """Raised when results are read from a flow whose children have not all settled yet
    (read them downstream of the sensor)."""


class ConnectionNotDefined(EchoMQError, AirflowNotFoundException):
    """Raised when the task's ``echomq`` connection is not defined anywhere Airflow looks (the
    metadata DB, a secrets backend, an ``AIRFLOW_CONN_...`` variable). The message names the
    conn id and the two ways to define it, so a first run says what to do instead of only
    "isn't defined". Also an ``AirflowNotFoundException``, so code that caught Airflow's error
    still catches it. ``.conn_id`` names the connection."""

    def __init__(self, conn_id: str) -> None:
        self.conn_id = conn_id
        env = "AIRFLOW_CONN_" + conn_id.upper()
        super().__init__(
            f"the EchoMQ connection {conn_id!r} is not defined: define it where the Airflow "
            f"processes (scheduler, workers, triggerer) read it, either as an environment "
            f"variable, {env}='echomq://HOST:6379/0' (add ?prefix=... for a key prefix), or "
            f"with `airflow connections add {conn_id} --conn-uri 'echomq://HOST:6379/0'`; or "
            "pass echomq_conn_id= the connection you defined"
        )
