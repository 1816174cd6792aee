"""Where the dashboard shows a flow, a job and a queue: one home for the paths, built here for
the dashboard's own links, the Airflow provider's extra link and the Dagster integration's
metadata, and split here by the dashboard's routes. Standard library only, so the adapters
link to the dashboard without its extra installed.

Both names may hold ``/`` (queue names and job ids allow it: Airflow's derived parent ids are
``JOB-af/<dag>/<task>/<digest>``), and an id may hold ``#``, which a URL must not carry
unescaped. So :func:`flow_page` quotes each name whole (``/`` as ``%2F``, ``#`` as ``%23``)
and :func:`split_flow_path` splits the path at its literal slashes, as the client sent it.
"""

from __future__ import annotations

from collections.abc import Collection
from urllib.parse import quote, unquote

#: The dashboard's path of a flow's page, under where the dashboard is served.
FLOW_PATH = "/flow/"
#: ... of a job's page (any job: plain, a flow's child, a flow's parent).
JOB_PATH = "/job/"
#: ... of a queue's jobs by state.
QUEUE_PATH = "/queue/"


def flow_page(base: str, queue: str, parent_id: str, tail: str = "") -> str:
    """The URL of a flow's page under a dashboard served at ``base`` (``http://host:8787``,
    or ``/echomq`` inside Airflow's api-server); both names are quoted whole. ``tail``: a
    path below the page (``cancel``, or ``values`` of its JSON twin ``base`` + ``/api``)."""
    path = f"{base.rstrip('/')}{FLOW_PATH}{quote(queue, safe='')}/{quote(parent_id, safe='')}"
    return f"{path}/{tail}" if tail else path


def job_page(base: str, queue: str, job_id: str, tail: str = "") -> str:
    """The URL of a job's page (``tail``: ``retry`` / ``cancel``), quoted as :func:`flow_page`
    quotes a flow's; split by :func:`split_flow_path` too."""
    path = f"{base.rstrip('/')}{JOB_PATH}{quote(queue, safe='')}/{quote(job_id, safe='')}"
    return f"{path}/{tail}" if tail else path


def queue_page(base: str, queue: str) -> str:
    """The URL of a queue's jobs by state (the name quoted whole)."""
    return f"{base.rstrip('/')}{QUEUE_PATH}{quote(queue, safe='')}"


def split_flow_path(rest: str, tails: Collection[str] = ()) -> tuple[str, str, str]:
    """``(queue, parent id, tail)`` of the part of a flow's path after :data:`FLOW_PATH`.

    The form :func:`flow_page` builds, ``<queue>/<id>[/<tail>]`` with each name quoted, splits
    at its literal slashes whatever the names hold. A path whose ``%2F`` were decoded on the way
    (a proxy that normalises paths, a person typing one) is split where the id begins: at the
    first segment past the first that starts with ``JOB-`` (so a queue name that holds such a
    segment is only reached in the quoted form). ``tail`` is the last segment when it is one of
    ``tails`` and two segments stand before it, else ``""``: in the decoded form a page's id
    ending in ``/<tail>`` reads as that tail - the quoted form is never ambiguous.

    The names are not checked here (the caller's ``check_queue`` / ``check_job_id`` do).
    """
    parts = rest.split("/")
    tail = parts.pop() if len(parts) > 2 and parts[-1] in tails else ""
    if len(parts) == 2:
        return unquote(parts[0]), unquote(parts[1]), tail
    words = unquote("/".join(parts)).split("/")
    for i in range(1, len(words)):
        if words[i].startswith("JOB-"):
            return "/".join(words[:i]), "/".join(words[i:]), tail
    return words[0], "/".join(words[1:]), tail
