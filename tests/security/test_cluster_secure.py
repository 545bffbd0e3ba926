"""``rediss+cluster://`` with an ACL user: TLS proxies in front of the cluster nodes
(each node announces its proxy's port, so the client discovers TLS endpoints), and the
least-privileged user of the security tests plus the two commands the cluster client
needs for discovery (``CLUSTER SLOTS``, ``COMMAND``)."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote
from uuid import uuid4

import pytest
from fixtures.acl import acl_setuser_args
from fixtures.cluster import *  # noqa: F403
from fixtures.cluster import APP_REF, node_client, queues_on_nodes, read_runs
from fixtures.tlsproxy import Certs, TLSProxy, make_certs
from helpers import run_cli, start_cli

from batchq.dev.cluster import EmbeddedCluster

pytestmark = [pytest.mark.integration, pytest.mark.cluster]

CLUSTER_EXTRA = ("+cluster|slots", "+command")
"""What a cluster client needs on top of the single-node ACL line."""


@dataclass
class SecureCluster:
    cluster: EmbeddedCluster
    proxies: list[TLSProxy]
    certs: Certs
    namespace: str
    password: str

    @property
    def url(self) -> str:
        return (f"rediss+cluster://batchq:{quote(self.password, safe='')}@127.0.0.1:"
                f"{self.proxies[0].port}?ssl_ca_certs={self.certs.ca}")


@pytest.fixture(scope="module")
def secure_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureCluster]:
    certs = make_certs(tmp_path_factory.mktemp("certs"))
    ns, pw = f"sc{uuid4().hex[:8]}", f"pw{uuid4().hex}"
    with EmbeddedCluster(3) as cluster:
        proxies = [TLSProxy(n.port, certs.server_cert, certs.server_key).start()
                   for n in cluster.nodes]
        try:
            for i, p in enumerate(proxies):
                r = node_client(cluster, i)
                try:
                    r.config_set("cluster-announce-bus-port", cluster.bus_ports[i])
                    r.config_set("cluster-announce-port", p.port)
                    r.execute_command("ACL", "SETUSER", *acl_setuser_args("batchq", pw, ns),
                                      *CLUSTER_EXTRA)
                    r.acl_log_reset()
                finally:
                    r.close()
            want = sorted(p.port for p in proxies)
            deadline = time.monotonic() + 20
            while not all(_announced(cluster, i) == want for i in range(3)):
                assert time.monotonic() < deadline, "announced ports did not spread"
                time.sleep(0.05)
            yield SecureCluster(cluster, proxies, certs, ns, pw)
        finally:
            for p in proxies:
                p.stop()


def _announced(cluster: EmbeddedCluster, index: int) -> list[int]:
    r = node_client(cluster, index)
    try:
        return sorted(int(s[2][1]) for s in r.execute_command("CLUSTER", "SLOTS"))
    finally:
        r.close()


def test_tls_cluster_with_acl_user(secure_cluster: SecureCluster, tmp_path: Path) -> None:
    sc = secure_cluster
    ns, log = sc.namespace, tmp_path / "runs.log"
    qs = queues_on_nodes(sc.cluster, ns)
    from apps.cluster_app import build

    app = build(sc.url, ns, str(log))
    try:
        assert len(app.redis.get_primaries()) == 3  # discovered through the TLS seed
        for q in qs:
            app.tasks["rec"].options(queue=q).enqueue_many([f"{q}-{i}" for i in range(1000)])
        app.tasks["flaky"].options(queue=qs[1]).enqueue("F")
        env = {k: None for k in ("BATCHQ_QUEUES", "BATCHQ_PROCESSES", "BATCHQ_BURST")}
        env.update({"BATCHQ_REDIS_URL": sc.url, "BATCHQ_TEST_NS": ns,
                    "BATCHQ_TEST_LOG": str(log), "BATCHQ_NAMESPACE": ns})
        worker = start_cli(["worker", APP_REF, "-q", ",".join(qs), "--burst"], env=env)
        assert worker.wait(timeout=60) == 0, worker.read_log()
        assert "Traceback" not in worker.read_log()
        counts = Counter(t for _, t, _, _ in read_runs(log, "rec"))
        assert len(counts) == 3000 and set(counts.values()) == {1}
        assert app.queue(qs[1]).stats().dead == 1

        res = run_cli(["info", "--json"], env=env)
        assert res.returncode == 0, res.stderr
        assert json.loads(res.stdout)["queues"][qs[1]]["dead"] == 1
        assert sc.password not in res.stdout + res.stderr
        res = run_cli(["check"], env=env)
        assert res.returncode == 0 and "cannot be read" in res.stdout, res
    finally:
        app.close()
    for i in range(3):
        r = node_client(sc.cluster, i)
        try:
            refused = {str(e["object"]) for e in r.acl_log()}
        finally:
            r.close()
        assert refused <= {"config|get"}, (i, refused)
