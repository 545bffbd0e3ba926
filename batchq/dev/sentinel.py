"""An embedded Sentinel set: a Valkey primary, its replicas and several Sentinels, all
from the bundled ``valkey-server`` binary (a Sentinel is ``valkey-server CONF
--sentinel``), on free loopback ports. For the failover tests and for trying batchq's
``redis+sentinel://`` URLs without installing anything.

Typical use::

    from batchq.dev.sentinel import EmbeddedSentinels

    with EmbeddedSentinels() as s:
        print(s.url)  # redis+sentinel://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3/batchq
        s.kill_primary()  # SIGKILL; the Sentinels promote the replica
        s.wait_failover()

``down_after_ms`` / ``failover_timeout_ms`` are short by default (1 s / 3 s) so a test
sees a failover within a few seconds; production Sentinels use 5-30 s.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

import redis

from .server import EmbeddedServer, binary_path, pick_free_port

__all__ = ["EmbeddedSentinels"]

_DATA_ARGS = ("--repl-diskless-sync-delay", "0")
"""A replica's full sync starts at once (Valkey waits 5 s for more replicas by default)."""


class EmbeddedSentinels:
    """A primary, ``replicas`` replicas and ``sentinels`` Sentinels watching them as
    ``service``. ``primary`` is the data server that is primary now (as far as this
    object knows: ``wait_failover`` updates it)."""

    def __init__(self, *, service: str = "batchq", replicas: int = 1, sentinels: int = 3,
                 down_after_ms: int = 1000, failover_timeout_ms: int = 3000,
                 host: str = "127.0.0.1", appendonly: bool = False,
                 replica_via: Callable[[int], int] | None = None,
                 monitor_via: Callable[[int], int] | None = None,
                 sentinel_password: str | None = None) -> None:
        if not 1 <= sentinels <= 9 or not 0 <= replicas <= 9:
            raise ValueError("sentinels must be 1..9 and replicas 0..9")
        self.service = service
        self.n_replicas = replicas
        self.n_sentinels = sentinels
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self.host = host
        self.appendonly = appendonly
        self.replica_via = replica_via
        self.monitor_via = monitor_via
        """Maps the first primary's port to the port the Sentinels monitor it at, the
        address they hand to clients (a test's TCP proxy, to cut the primary off from
        them); None: directly."""
        self.sentinel_password = sentinel_password
        """The Sentinels' ``requirepass`` (None: none)."""
        """Maps the first primary's port to the port its replicas connect to (a test's
        TCP proxy, to delay or drop the replication stream); None: directly."""
        self.servers: list[EmbeddedServer] = []
        """Every data server started, the first one the first primary."""
        self.primary: EmbeddedServer | None = None
        self.sentinel_ports: list[int] = []
        self._procs: list[subprocess.Popen[bytes] | None] = []
        self._dir = ""

    # --- addresses ----------------------------------------------------------------------

    @property
    def url(self) -> str:
        """``redis+sentinel://`` URL of the set (database 0)."""
        hosts = ",".join(f"{self.host}:{p}" for p in self.sentinel_ports)
        return f"redis+sentinel://{hosts}/{self.service}"

    @property
    def primary_url(self) -> str:
        """Plain URL of the current primary."""
        if self.primary is None:
            raise RuntimeError("not started")
        return self.primary.url

    def sentinel_client(self, index: int = 0) -> redis.Redis:
        return redis.Redis(host=self.host, port=self.sentinel_ports[index],
                           password=self.sentinel_password, socket_timeout=2.0,
                           decode_responses=True)

    # --- lifecycle ----------------------------------------------------------------------

    def start(self, timeout_s: float = 30.0) -> EmbeddedSentinels:
        deadline = time.monotonic() + timeout_s
        self._dir = tempfile.mkdtemp(prefix="batchq-sentinel-")
        try:
            first = EmbeddedServer(host=self.host, appendonly=self.appendonly,
                                   extra_args=_DATA_ARGS).start()
            self.servers.append(first)
            self.primary = first
            upstream = self.replica_via(first.port) if self.replica_via else first.port
            for _ in range(self.n_replicas):
                self.servers.append(self._replica_of(upstream))
            monitored = self.monitor_via(first.port) if self.monitor_via else first.port
            for i in range(self.n_sentinels):
                self._start_sentinel(i, monitored)
            self._wait_ready(deadline)
        except BaseException:
            self.stop()
            raise
        return self

    def _replica_of(self, primary_port: int) -> EmbeddedServer:
        return EmbeddedServer(host=self.host, appendonly=self.appendonly, extra_args=(
            *_DATA_ARGS, "--replicaof", self.host, str(primary_port))).start()

    def _start_sentinel(self, index: int, primary_port: int) -> None:
        port = pick_free_port(self.host)
        workdir = Path(self._dir) / f"sentinel{index}"
        workdir.mkdir(exist_ok=True)
        conf = workdir / "sentinel.conf"
        conf.write_text("\n".join([
            f"port {port}", f"bind {self.host}", "daemonize no", "protected-mode no",
            f"dir {workdir}", f"logfile {workdir / 'sentinel.log'}",
            f"sentinel announce-ip {self.host}",
            f"sentinel monitor {self.service} {self.host} {primary_port} "
            f"{self.n_sentinels // 2 + 1}",
            f"sentinel down-after-milliseconds {self.service} {self.down_after_ms}",
            f"sentinel failover-timeout {self.service} {self.failover_timeout_ms}",
            f"sentinel parallel-syncs {self.service} 1",
            *([f"requirepass {self.sentinel_password}"] if self.sentinel_password else []),
            ""]))
        proc = subprocess.Popen([str(binary_path()), str(conf), "--sentinel"],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, cwd=workdir, close_fds=True)
        self._procs.append(proc)
        self.sentinel_ports.append(port)

    def _wait_ready(self, deadline: float) -> None:
        """Until every Sentinel sees the others and the replicas (a failover needs both)."""
        want_others = self.n_sentinels - 1
        while True:
            ready = 0
            for i in range(self.n_sentinels):
                with contextlib.suppress(redis.RedisError, OSError):
                    m: Any = self.sentinel_client(i).sentinel_master(self.service)
                    if int(m["num-other-sentinels"]) >= want_others and \
                            int(m["num-slaves"]) >= self.n_replicas:
                        ready += 1
            if ready == self.n_sentinels and self._online() >= self.n_replicas \
                    and self._acking(deadline):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"Sentinels not ready: {ready} of {self.n_sentinels}"
                                   f" see the whole set")
            time.sleep(0.1)

    def stop(self) -> None:
        for proc in self._procs:
            if proc is not None and proc.poll() is None:
                proc.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=5)
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        self._procs = []
        for server in self.servers:
            server.stop()
        self.servers = []
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = ""

    def __enter__(self) -> EmbeddedSentinels:
        if self.primary is None:
            self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # --- faults -------------------------------------------------------------------------

    def discovered(self, index: int = 0) -> tuple[str, int] | None:
        """The primary's address as Sentinel ``index`` reports it."""
        with contextlib.suppress(redis.RedisError, OSError):
            addr: Any = self.sentinel_client(index).sentinel_get_master_addr_by_name(
                self.service)
            if addr:
                return str(addr[0]), int(addr[1])
        return None

    def kill_primary(self) -> EmbeddedServer:
        """SIGKILL the current primary (no shutdown, no last replication); returns it."""
        old = self.primary
        if old is None or old.pid is None:
            raise RuntimeError("no primary running")
        os.kill(old.pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            old._proc.wait(timeout=5)  # type: ignore[union-attr]
        return old

    def wait_failover(self, old_port: int, timeout_s: float = 30.0) -> EmbeddedServer:
        """Until the Sentinels agree on a primary other than ``old_port`` (as a client
        finds it: ``discover_master``) and it answers as a primary; returns it (and makes
        it ``primary``)."""
        import redis.sentinel

        live = [(self.host, p) for p, proc in zip(self.sentinel_ports, self._procs,
                                                   strict=True) if proc is not None]
        finder: Any = redis.sentinel.Sentinel(  # type: ignore[no-untyped-call]
            live, sentinel_kwargs={"socket_timeout": 1.0,
                                   "password": self.sentinel_password})
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(redis.RedisError, OSError):
                addr = finder.discover_master(self.service)
                agree = all(self.discovered(i) == (addr[0], int(addr[1]))
                            for i, proc in enumerate(self._procs) if proc is not None)
                if int(addr[1]) != old_port and agree:
                    for server in self.servers:
                        if server.port == int(addr[1]) and server.is_running():
                            role = redis.Redis(host=self.host, port=server.port,
                                               socket_timeout=1.0).role()
                            if role and role[0] in (b"master", "master"):
                                self.primary = server
                                return server
            time.sleep(0.05)
        raise RuntimeError(f"no failover within {timeout_s}s")

    def restart(self, server: EmbeddedServer) -> EmbeddedServer:
        """Start a killed data server again on its port (empty: no persistence); the
        Sentinels turn it into a replica of the current primary."""
        port = server.port
        server.stop()
        self.servers.remove(server)
        again = EmbeddedServer(port, host=self.host, appendonly=self.appendonly,
                               extra_args=_DATA_ARGS).start()
        self.servers.append(again)
        return again

    def kill_sentinel(self, index: int) -> None:
        proc = self._procs[index]
        if proc is not None:
            proc.kill()
            proc.wait()
            self._procs[index] = None

    def _online(self) -> int:
        """Replicas of the current primary in sync (state ``online``); 0 if unreachable."""
        client = redis.Redis.from_url(self.primary_url, socket_timeout=2.0)
        try:
            info: Any = client.info("replication")
        except (redis.RedisError, OSError):
            return 0
        finally:
            client.close()
        return sum(1 for k, v in info.items()
                   if k.startswith("slave") and isinstance(v, dict)
                   and v.get("state") == "online")

    def _acking(self, deadline: float) -> bool:
        """Every replica confirms a write (``WAIT``): a replica just in sync takes about
        a second to send its first acknowledgement."""
        client = redis.Redis.from_url(self.primary_url, socket_timeout=35.0)
        try:
            pipe: Any = client.pipeline(transaction=False)
            pipe.set("batchq-dev:sync", 1, px=5000)
            wait_ms = max(1, int((deadline - time.monotonic()) * 1000))
            pipe.execute_command("WAIT", self.n_replicas, wait_ms)
            return int(pipe.execute()[-1]) >= self.n_replicas
        except (redis.RedisError, OSError):
            return False
        finally:
            client.close()

    def replicas_of_primary(self) -> int:
        """Replicas of the current primary in sync (``INFO replication``)."""
        return self._online()

    def wait_replicas(self, n: int, timeout_s: float = 30.0) -> None:
        """Until the current primary has ``n`` connected replicas in sync."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(redis.RedisError, OSError):
                if self.replicas_of_primary() >= n:
                    return
            time.sleep(0.1)
        raise RuntimeError(f"primary has not {n} replicas after {timeout_s}s")
