"""What every example DAG here is, besides its own id and docs: started by hand (``dags test``,
or a trigger), never on a schedule nor for past dates, and tagged ``echomq`` and ``example``.
Each example passes it to ``@dag``: ``@dag(dag_id=..., doc_md=__doc__, **EXAMPLE_DAG)``."""

from __future__ import annotations

from datetime import datetime
from typing import Any

EXAMPLE_DAG: dict[str, Any] = {
    "schedule": None,
    "start_date": datetime(2026, 1, 1),
    "catchup": False,
    "tags": ["echomq", "example"],
}
