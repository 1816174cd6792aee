"""A real follower process for tests: ``python stream_reader_proc.py URL CLUSTER PREFIX QUEUE
PARENT_ID OUT [CURSOR]``. Follows the flow's results (iter_results, follow=True) from CURSOR
(the start when absent) and appends one line per result to OUT, ``child id <TAB> value (JSON)
<TAB> cursor``, flushed and fsynced before the next is read: the line is the caller's stored
cursor, so a SIGKILL between two lines loses nothing that was stored. Prints "ready" once it
is following and "end" when the flow was released."""

from __future__ import annotations

import json
import os
import sys

from echomq_core import EchoMQ


def main() -> None:
    url, cluster, prefix, queue, parent_id, out = sys.argv[1:7]
    cursor = sys.argv[7] if len(sys.argv) > 7 else None
    mq = EchoMQ(url, cluster=cluster == "1", prefix=prefix)
    results = mq.iter_results(queue, parent_id, cursor=cursor, block=0.2)
    print("ready", flush=True)
    with open(out, "a", encoding="utf-8") as f:
        for child_id, value in results:
            f.write(f"{child_id}\t{json.dumps(value)}\t{results.cursor}\n")
            f.flush()
            os.fsync(f.fileno())
    print("end", flush=True)
    mq.close()


if __name__ == "__main__":
    main()
