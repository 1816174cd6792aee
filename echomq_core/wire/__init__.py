"""The wire: connection URLs, the sync and asyncio drivers, Cluster routing, packing, replies, the
Lua script registry, the keyspace, and waiting out a server that cannot take a call yet."""
