"""Redis access: connections, clients, the fast lane, keys, the entry codec, ids, the Lua
scripts, Sentinel, replicas, shards."""
