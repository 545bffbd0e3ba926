"""The task of the worked load test: one HTTP GET of ``url`` per job.

A tiny keep-alive client on asyncio streams (one pool per worker process): the run
time the worker records is the request's round trip. A non-200 answer is reported with
``batchq.current_job().record(status=...)`` rather than raised, so it shows in the
report as an error type ("429", "503") and the job is not retried.
"""

from __future__ import annotations

import asyncio
import os
from urllib.parse import urlsplit

import batchq

app = batchq.App(os.environ.get("BATCHQ_REDIS_URL", "redis://127.0.0.1:6379/0"),
                 namespace=os.environ.get("LOADTEST_NS", "batchq"))

_pools: dict[str, list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]] = {}


async def _get(url: str) -> int:
    u = urlsplit(url)
    pool = _pools.setdefault(u.netloc, [])
    conn = pool.pop() if pool else await asyncio.open_connection(u.hostname, u.port)
    reader, writer = conn
    try:
        writer.write(f"GET {u.path or '/'} HTTP/1.1\r\nHost: {u.netloc}\r\n\r\n".encode())
        status = int((await reader.readline()).split()[1])
        length = 0
        while (line := await reader.readline()) not in (b"\r\n", b""):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        await reader.readexactly(length)
    except BaseException:
        writer.close()
        raise
    pool.append(conn)
    return status


@app.task(queue="loadtest")
async def hit(url: str) -> None:
    status = await _get(url)
    if status != 200:
        batchq.current_job().record(status=str(status), message=f"GET {url}: {status}")


@app.task(queue="loadtest")
async def sleep_ms(ms: float) -> None:
    """A target that takes exactly ``ms`` (for the accuracy figure)."""
    await asyncio.sleep(ms / 1000)


_calls = [0]


@app.task(queue="loadtest")
async def flaky(n: int) -> None:
    """Fails by raising every ``n``-th call in this process, for the error report."""
    _calls[0] += 1
    if _calls[0] % n == 0:
        raise ValueError(f"call {_calls[0]} failed on purpose")


@app.task(queue="loadtest")
def sync_hit(url: str) -> None:
    """The same call from a plain function (runs in the worker's thread pool)."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            resp.read()
    except urllib.error.HTTPError as exc:
        batchq.current_job().record(exc.code, f"GET {url}: {exc.code}")
