"""Fixtures for the security tests: an embedded Valkey with an ACL user limited to what
batchq needs, self-signed certificates (``openssl`` CLI) and a TLS-terminating proxy
(the embedded Valkey is built without TLS), and worker processes of
``apps.sec_app:app``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from urllib.parse import quote
from uuid import uuid4

import pytest
import redis
from fixtures.acl import acl_setuser_args
from fixtures.tlsproxy import Certs, TLSProxy, make_certs
from helpers import CliProcess
from workers import WorkerProcs, worker_env

from batchq.dev.server import EmbeddedServer

APP_REF = "apps.sec_app:app"

@dataclass
class AclServer:
    """An embedded Valkey where ``default`` is disabled, ``admin`` may do anything and
    ``batchq`` (password ``password``) only what batchq needs, on keys ``<ns>:*``."""

    server: EmbeddedServer
    namespace: str
    password: str
    admin_password: str

    @property
    def url(self) -> str:
        """The batchq user's URL (password percent-encoded)."""
        return (f"redis://batchq:{quote(self.password, safe='')}@127.0.0.1:"
                f"{self.server.port}/0")

    def admin(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.server.port, username="admin",
                           password=self.admin_password, decode_responses=True)

    def denials(self) -> list[dict[str, object]]:
        """ACL LOG entries (commands or keys refused) since the last reset."""
        r = self.admin()
        try:
            return list(r.acl_log())
        finally:
            r.close()


@pytest.fixture(scope="module")
def acl_server() -> Iterator[AclServer]:
    namespace = f"sec{uuid4().hex[:8]}"
    # '@' and '/' must be percent-encoded in a URL: the scrubbing must know both forms
    password = f"pw@{uuid4().hex}/x"
    admin_password = f"adm{uuid4().hex}"
    with EmbeddedServer() as server:
        r = redis.Redis(host="127.0.0.1", port=server.port)
        try:
            r.execute_command("ACL", "SETUSER", "admin", "on", f">{admin_password}", "~*",
                              "&*", "+@all")
            r.execute_command("ACL", "SETUSER", *acl_setuser_args("batchq", password,
                                                                  namespace))
        finally:
            r.close()
        s = AclServer(server, namespace, password, admin_password)
        a = s.admin()
        try:
            a.execute_command("ACL", "SETUSER", "default", "off")
            a.acl_log_reset()
        finally:
            a.close()
        yield s


# --- certificates --------------------------------------------------------------------------


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    """A CA, a server certificate for 127.0.0.1/localhost and a client certificate it
    signed, and an unrelated CA."""
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def plain_server() -> Iterator[EmbeddedServer]:
    with EmbeddedServer() as server:
        yield server


@pytest.fixture(scope="module")
def tls_proxy(plain_server: EmbeddedServer, certs: Certs) -> Iterator[TLSProxy]:
    """TLS on loopback in front of the embedded Valkey (server certificate only)."""
    with TLSProxy(plain_server.port, certs.server_cert, certs.server_key) as p:
        yield p


@pytest.fixture(scope="module")
def mtls_proxy(plain_server: EmbeddedServer, certs: Certs) -> Iterator[TLSProxy]:
    """Like ``tls_proxy``, but clients must show a certificate signed by the CA."""
    with TLSProxy(plain_server.port, certs.server_cert, certs.server_key,
                  client_ca=certs.ca) as p:
        yield p


# --- workers ---------------------------------------------------------------------------------


def clean_env(**values: str) -> dict[str, str | None]:
    """The CLI's environment: ``values`` set, every other ``BATCHQ_*`` variable unset."""
    return worker_env(values)


WorkerFactory = Callable[..., CliProcess]


@pytest.fixture
def start_worker() -> Iterator[WorkerFactory]:
    """``start_worker(env, *args, serving=1)``: ``batchq worker apps.sec_app:app
    *args``; waits until ``serving`` processes serve (``serving=0``: does not wait).
    Any still running at teardown is SIGKILLed."""
    with WorkerProcs(APP_REF) as procs:

        def start(env: dict[str, str | None], *args: str, serving: int = 1) -> CliProcess:
            return procs.start(*args, env=env, serving=serving)

        yield start
