"""Connections and Redis deployments: clients, the lane, reconnects, restarts, network
faults, maxmemory, Sentinel, replicas, the embedded server."""
