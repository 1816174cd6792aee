"""The Cluster hash slot of a key, computed here as the server computes it.

CRC16 (XMODEM) of the key's hash tag - the bytes between the first ``{`` and the next ``}``,
when that span is not empty - else of the whole key, modulo 16384. The same rule as
``redis.crc.key_slot``, written out so that routing a key and grouping queues by slot do not
import redis-py (which defining a flow must not pay for).
"""

from __future__ import annotations

from binascii import crc_hqx

#: Hash slots of a Redis / Valkey Cluster.
SLOTS = 16384


def key_slot(key: bytes) -> int:
    """The slot of ``key`` (bytes: encode a ``str`` key as UTF-8 first)."""
    start = key.find(b"{")
    if start > -1:
        end = key.find(b"}", start + 1)
        if end > start + 1:
            key = key[start + 1 : end]
    return crc_hqx(key, 0) % SLOTS
