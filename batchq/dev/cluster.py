"""The embedded Valkey cluster: several :class:`~batchq.dev.server.EmbeddedServer` nodes
with ``cluster-enabled yes``, joined into one Redis Cluster (slot assignment, ``MEET``,
waiting for agreement), plus slot migration as ``valkey-cli --cluster reshard`` does it.
For the cluster tests and for trying batchq on a cluster without installing one.

Typical use::

    from batchq.dev.cluster import EmbeddedCluster

    with EmbeddedCluster(3) as cluster:
        print(cluster.url)  # redis+cluster://127.0.0.1:PORT
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from types import TracebackType
from typing import Any

from .server import PORT_ATTEMPTS, EmbeddedServer, format_host, pick_free_port

__all__ = ["CLUSTER_SLOTS", "EmbeddedCluster"]

CLUSTER_SLOTS = 16384


class EmbeddedCluster:
    """A Valkey cluster of ``masters`` primaries (no replicas) on free loopback ports.

    Every node is an :class:`EmbeddedServer` with ``cluster-enabled yes`` and its
    ``nodes.conf`` in the node's temporary directory; :meth:`start` splits the 16384
    slots evenly (``CLUSTER ADDSLOTSRANGE``), introduces the nodes (``CLUSTER MEET``)
    and waits until every node reports ``cluster_state:ok`` and agrees on the slot map.

    Typical use::

        with EmbeddedCluster() as cluster:
            print(cluster.url)  # redis+cluster://127.0.0.1:PORT

    ``extra_args`` go to every node (after the cluster options, so they win).
    """

    def __init__(
        self,
        masters: int = 3,
        *,
        host: str = "127.0.0.1",
        extra_args: Sequence[str] = (),
        node_timeout_ms: int = 5000,
    ) -> None:
        if not 1 <= masters <= 100:
            raise ValueError("masters must be 1..100")
        self.masters = masters
        self.host = host
        self.extra_args: tuple[str, ...] = tuple(extra_args)
        self.node_timeout_ms = node_timeout_ms
        self.nodes: list[EmbeddedServer] = []
        self.node_ids: list[str] = []
        self.bus_ports: list[int] = []
        self._lock = threading.RLock()

    # ------------------------------------------------------------------ state

    @property
    def url(self) -> str:
        """Seed URL of the first node, e.g. ``redis+cluster://127.0.0.1:7000`` (one seed
        is enough: the client discovers the rest)."""
        if not self.nodes:
            raise RuntimeError("EmbeddedCluster is not started; call start() first")
        return f"redis+cluster://{format_host(self.host)}:{self.nodes[0].port}"

    @property
    def ports(self) -> list[int]:
        return [n.port for n in self.nodes]

    def slot_ranges(self) -> list[tuple[int, int]]:
        """The (first, last) slot that :meth:`start` gave each node, in node order."""
        n = self.masters
        bounds = [CLUSTER_SLOTS * i // n for i in range(n + 1)]
        return [(bounds[i], bounds[i + 1] - 1) for i in range(n)]

    def node_url(self, index: int) -> str:
        """Plain (non-cluster) URL of one node, for admin commands."""
        return self.nodes[index].url

    def is_running(self) -> bool:
        return bool(self.nodes) and all(n.is_running() for n in self.nodes)

    def __repr__(self) -> str:
        return f"<EmbeddedCluster {self.host} ports={[n._port for n in self.nodes]}>"

    # -------------------------------------------------------------- lifecycle

    def start(self, timeout_s: float = 30.0) -> EmbeddedCluster:
        """Start the nodes, assign the slots, join them and wait for ``cluster_state:ok``.

        Returns ``self``; raises :class:`RuntimeError` (with node log tails) on failure.
        """
        with self._lock:
            if self.nodes:
                raise RuntimeError(f"{self!r} is already started")
            deadline = time.monotonic() + timeout_s
            try:
                for _ in range(self.masters):
                    self._start_node(deadline)
                self._form(deadline)
            except BaseException:
                self.stop()
                raise
            return self

    def _start_node(self, deadline: float) -> None:
        last: Exception | None = None
        for _ in range(PORT_ATTEMPTS):
            port, bus = pick_free_port(self.host), pick_free_port(self.host)
            if port == bus:
                continue
            node = EmbeddedServer(port, host=self.host, extra_args=(
                "--cluster-enabled", "yes",
                "--cluster-config-file", "nodes.conf",
                "--cluster-port", str(bus),
                "--cluster-node-timeout", str(self.node_timeout_ms),
                *self.extra_args,
            ))  # fmt: skip
            try:
                node.start(timeout_s=max(1.0, deadline - time.monotonic()))
            except RuntimeError as exc:  # most likely a port taken meanwhile
                last = exc
                continue
            self.nodes.append(node)
            self.bus_ports.append(bus)
            return
        raise RuntimeError(f"cannot start a cluster node: {last}")

    def _admin(self, index: int) -> Any:
        import redis

        return redis.Redis(host=self.host, port=self.nodes[index].port,
                           socket_timeout=5.0, decode_responses=True)

    def _form(self, deadline: float) -> None:
        clients = [self._admin(i) for i in range(self.masters)]
        try:
            self.node_ids = [str(c.execute_command("CLUSTER", "MYID")) for c in clients]
            for i, (c, (lo, hi)) in enumerate(zip(clients, self.slot_ranges(), strict=True)):
                # distinct epochs up front, as redis-cli --cluster create does
                c.execute_command("CLUSTER", "SET-CONFIG-EPOCH", i + 1)
                c.execute_command("CLUSTER", "ADDSLOTSRANGE", lo, hi)
            for i in range(1, self.masters):
                clients[0].execute_command("CLUSTER", "MEET", self.host, self.nodes[i].port,
                                           self.bus_ports[i])
            while not all(self._converged(c) for c in clients):
                if time.monotonic() >= deadline:
                    tails = "\n".join(n.log_tail(10) for n in self.nodes)
                    raise RuntimeError(f"{self!r} did not reach cluster_state:ok\n{tails}")
                time.sleep(0.05)
        finally:
            for c in clients:
                c.close()

    def _converged(self, client: Any) -> bool:
        info = str(client.execute_command("CLUSTER", "INFO"))
        fields = dict(line.split(":", 1) for line in info.split() if ":" in line)
        if fields.get("cluster_state") != "ok" \
                or fields.get("cluster_known_nodes") != str(self.masters):
            return False
        return self._owners(client) == dict(enumerate(self.node_ids))

    @staticmethod
    def _owners(client: Any) -> dict[int, str]:
        """Which node id serves each range start, as ``client`` sees it (by index)."""
        shards = client.execute_command("CLUSTER", "SLOTS")
        starts = sorted((int(s[0]), str(s[2][2])) for s in shards)
        return dict(enumerate(nid for _, nid in starts))

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop every node and remove their directories. Safe to call more than once."""
        with self._lock:
            nodes, self.nodes = self.nodes, []
            for node in nodes:
                node.stop(timeout_s)
            self.node_ids = []
            self.bus_ports = []

    def __enter__(self) -> EmbeddedCluster:
        if not self.nodes:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -------------------------------------------------------------- topology

    def slot_owner(self, slot: int) -> int:
        """Index (in :attr:`nodes`) of the node serving ``slot``, asked of node 0."""
        c = self._admin(0)
        try:
            for s in c.execute_command("CLUSTER", "SLOTS"):
                if int(s[0]) <= slot <= int(s[1]):
                    return self.node_ids.index(str(s[2][2]))
        finally:
            c.close()
        raise LookupError(f"slot {slot} is not served")

    def migrate_slot(self, slot: int, to: int, *, batch: int = 100,
                     pause_s: float = 0.0, timeout_ms: int = 5000) -> int:
        """Move ``slot`` to node ``to`` the way ``valkey-cli --cluster reshard`` does:
        ``SETSLOT IMPORTING`` on the target, ``SETSLOT MIGRATING`` on the source,
        ``MIGRATE`` the keys ``batch`` at a time (sleeping ``pause_s`` between batches,
        so clients see the slot half-moved), then ``SETSLOT NODE`` everywhere. Returns how
        many keys moved."""
        src = self.slot_owner(slot)
        if src == to:
            return 0
        clients = [self._admin(i) for i in range(self.masters)]
        s, d = clients[src], clients[to]
        try:
            d.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", self.node_ids[src])
            s.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", self.node_ids[to])
            moved = 0
            while True:
                keys = s.execute_command("CLUSTER", "GETKEYSINSLOT", slot, batch)
                if not keys:
                    break
                s.execute_command("MIGRATE", self.host, self.nodes[to].port, "", 0,
                                  timeout_ms, "KEYS", *keys)
                moved += len(keys)
                if pause_s:
                    time.sleep(pause_s)
            # the target first, then the source, then the rest (as valkey-cli does)
            for i in (to, src, *(i for i in range(self.masters) if i not in (to, src))):
                clients[i].execute_command("CLUSTER", "SETSLOT", slot, "NODE",
                                           self.node_ids[to])
            return moved
        finally:
            for c in clients:
                c.close()
