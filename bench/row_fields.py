"""What the claim's rows read pays for its fourth field: server instructions per job of the
``rows`` script asking claiming.ROW_FIELDS (payload, parent, run, state) against the first three,
on the same 5,000 claimed W1 rows, alternated twice, counted by callgrind
(:class:`bench.cpu_phases.Counted`; needs valgrind).

    python -m bench.row_fields            # from a clone of the commit measured
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from bench.cpu_phases import BATCH, Counted
from echomq_core import EchoMQ
from echomq_core.queues import claiming
from echomq_core.queues.registry import lease_token
from echomq_core.wire.calls import Call


def main(n: int = 5000) -> None:
    out = Path(tempfile.mkdtemp())
    c = Counted(out)
    mq = EchoMQ(c.server.url, prefix="f")
    q, ks, token = mq.queue("w1"), mq.keys, lease_token("host-1-0badc0de")
    q.add_bulk(range(n))
    parts: list[list[str]] = []
    call = Call.lua("claim", ks.claim_keys("w1"), [BATCH, 30_000, token, 100])
    while len(reply := mq.connection.execute([call])[0]) > 1:
        parts.append([i.decode() for i in reply[1:]])
    base = ks.job_prefix("w1")
    try:
        for fields in (claiming.ROW_FIELDS, claiming.ROW_FIELDS[:3]) * 2:
            calls = [Call.lua("rows", [base + i for i in part], fields) for part in parts]
            total = c.run(lambda calls=calls: [mq.connection.execute([x]) for x in calls])
            print(f"{len(fields)} fields: {round(total / n)} instructions per job")
    finally:
        mq.close()
        c.server.stop()


if __name__ == "__main__":
    main()
