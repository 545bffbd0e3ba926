"""TLS helpers for tests: self-signed certificates made with the ``openssl`` CLI, and a
TLS-terminating TCP proxy (TLS on a free loopback port, plain TCP to a local server: the
embedded Valkey has no TLS) running its own asyncio loop in a thread (the shared
:class:`tcpproxy.ThreadedProxy`)."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tcpproxy import ThreadedProxy

OPENSSL = "/usr/bin/openssl"


@dataclass(frozen=True)
class Certs:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path
    """A CA that signed nothing here: trusting only it must fail the handshake."""


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run([OPENSSL, *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_ca(d: Path, name: str) -> None:
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "2",
             "-subj", f"/CN=batchq test {name}",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d)


def make_leaf(d: Path, name: str, usage: str) -> None:
    (d / f"{name}.ext").write_text(
        "basicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature\n"
        f"extendedKeyUsage={usage}\n"
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
        "subjectKeyIdentifier=hash\n"
        "authorityKeyIdentifier=keyid\n")
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=d)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", f"{name}.pem", "-days", "2",
             "-extfile", f"{name}.ext", cwd=d)


def make_certs(d: Path) -> Certs:
    """In ``d``: a CA, a server certificate for 127.0.0.1/localhost and a client
    certificate it signed, and an unrelated CA (``openssl`` CLI, EC keys: fast)."""
    make_ca(d, "ca")
    make_ca(d, "other")
    make_leaf(d, "server", "serverAuth")
    make_leaf(d, "client", "clientAuth")
    return Certs(d / "ca.pem", d / "server.pem", d / "server.key", d / "client.pem",
                 d / "client.key", d / "other.pem")


class TLSProxy(ThreadedProxy):
    """``TLSProxy(target_port, certfile, keyfile, client_ca=None)``: clients connect with
    TLS to ``127.0.0.1:port``; each connection is piped to ``127.0.0.1:target_port``.
    With ``client_ca`` the proxy requires a client certificate signed by it."""

    thread_name = "tls-proxy"

    def __init__(self, target_port: int, certfile: Path, keyfile: Path, *,
                 client_ca: Path | None = None, host: str = "127.0.0.1") -> None:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(str(certfile), str(keyfile))
        if client_ca is not None:
            ctx.verify_mode = ssl.CERT_REQUIRED
            ctx.load_verify_locations(str(client_ca))
        super().__init__(target_port, host, host=host, ssl_context=ctx)
        self.target_port = target_port
        self.handshake_failures = 0
        self._conns: set[asyncio.Task[None]] = set()

    def _on_loop_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        # failed handshakes (a client trusting another CA) are expected here
        self.handshake_failures += 1

    async def _handle(self, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        try:
            up_r, up_w = await self._open_upstream()
        except OSError:
            writer.close()
            self._conns.discard(task)
            return
        try:
            await asyncio.gather(_pipe(reader, up_w), _pipe(up_r, writer))
        finally:
            for w in (writer, up_w):
                with contextlib.suppress(Exception):
                    w.close()
            self._conns.discard(task)

    async def _close_connections(self) -> None:
        for t in list(self._conns):
            t.cancel()
        await asyncio.gather(*self._conns, return_exceptions=True)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError, ssl.SSLError):
        pass
    finally:
        with contextlib.suppress(Exception):
            if writer.can_write_eof():
                writer.write_eof()
