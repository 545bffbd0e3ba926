"""The app the flow-control scenarios' workers run: ``batchq worker bench.apps.flowapp:app``.

* ``send(sender, mid)`` (queue ``fanout``): one real HTTP request to the mock provider
  (``bench/apps/mockprovider.py``, URL in ``$FLOW_PROVIDER_URL``) over a keep-alive
  connection (a small pool of asyncio streams per process, standard library only); a
  429 raises ``batchq.RateLimited(Retry-After)``.
* ``tick(tag)`` (queue ``ratecheck``): appends ``"<tag> <time.time() at start>"`` to
  the file named by ``$FLOW_TICK_LOG`` (O_APPEND: every process of every fleet shares
  it), then sleeps ``$FLOW_TICK_WORK_S`` (default 0.005 s).
"""

from __future__ import annotations

import asyncio
import os
import time
from urllib.parse import urlsplit

import batchq

FANOUT = "fanout"
RATECHECK = "ratecheck"
URL_ENV = "FLOW_PROVIDER_URL"
LOG_ENV = "FLOW_TICK_LOG"
WORK_ENV = "FLOW_TICK_WORK_S"

Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class Client:
    """A keep-alive HTTP/1.1 client for one host: a pool of idle connections, one
    request at a time on each (enough for the mock: bodies are small)."""

    def __init__(self, url: str) -> None:
        u = urlsplit(url)
        self.host = u.hostname or "127.0.0.1"
        self.port = u.port or 80
        self.netloc = u.netloc
        self.idle: list[Conn] = []

    async def post(self, path: str) -> tuple[int, dict[bytes, bytes]]:
        conn = self.idle.pop() if self.idle else await asyncio.open_connection(
            self.host, self.port)
        reader, writer = conn
        try:
            writer.write(f"POST {path} HTTP/1.1\r\nHost: {self.netloc}\r\n"
                         f"X-Sent: {time.time():.6f}\r\nContent-Length: 0\r\n\r\n".encode())
            status = int((await reader.readline()).split()[1])
            headers: dict[bytes, bytes] = {}
            while (line := await reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.partition(b":")
                headers[name.strip().lower()] = value.strip()
            await reader.readexactly(int(headers.get(b"content-length", b"0")))
        except BaseException:
            writer.close()
            raise
        self.idle.append(conn)
        return status, headers


def make_app(redis_url: str | None = None, namespace: str = "bench") -> batchq.App:
    app = batchq.App(redis_url, namespace=namespace)
    client: list[Client] = []
    tick_fd: list[int] = []
    work_s = float(os.environ.get(WORK_ENV, "0.005"))

    @app.task(queue=FANOUT, max_attempts=3)
    async def send(sender: str, mid: int) -> None:
        """One message to the provider; 429 -> RateLimited(Retry-After)."""
        if not client:
            client.append(Client(os.environ[URL_ENV]))
        status, headers = await client[0].post(f"/send?sender={sender}&id={mid}")
        if status == 429:
            raise batchq.RateLimited(float(headers.get(b"retry-after", b"1")))
        if status != 200:
            raise RuntimeError(f"provider answered {status}")

    @app.task(queue=RATECHECK)
    async def tick(tag: str) -> None:
        """Notes its start time (the handler's clock) in the shared log, then works."""
        t0 = time.time()
        if not tick_fd:
            tick_fd.append(os.open(os.environ[LOG_ENV],
                                   os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644))
        os.write(tick_fd[0], f"{tag} {t0:.6f}\n".encode())
        if work_s:
            await asyncio.sleep(work_s)

    return app


app = make_app(os.environ.get("BATCHQ_REDIS_URL"), os.environ.get("BENCH_NAMESPACE", "bench"))
