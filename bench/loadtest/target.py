"""A local HTTP target for load tests: standard library only (asyncio), on loopback.

Each request holds one of ``--capacity`` slots for ``--latency-ms``: below
``capacity / latency`` requests per second the latency is flat, above it requests
queue and the latency climbs (the knee). A request that finds more than ``--max-queue``
others waiting gets ``429`` at once. ``GET /status/503`` answers that status (after
the latency), for error tests. Prints ``listening on http://127.0.0.1:PORT`` when ready.

    python -m bench.loadtest.target --latency-ms 20 --capacity 40   # knee 2,000 req/s
"""

from __future__ import annotations

import argparse
import asyncio
import sys


class Target:
    def __init__(self, latency_s: float, capacity: int, max_queue: int) -> None:
        self.latency_s = latency_s
        self.slots = asyncio.Semaphore(capacity)
        self.max_queue = max_queue
        self.waiting = 0
        self.served = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:  # keep-alive: one request after another on a connection
                line = await reader.readline()
                if not line:
                    break
                while await reader.readline() not in (b"\r\n", b"\n", b""):
                    pass
                parts = line.split()
                path = parts[1].decode() if len(parts) > 1 else "/"
                status = await self.serve(path)
                body = b"ok\n" if status == 200 else b"no\n"
                writer.write(b"HTTP/1.1 %d X\r\nContent-Length: %d\r\n\r\n%s"
                             % (status, len(body), body))
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def serve(self, path: str) -> int:
        if self.waiting >= self.max_queue:
            return 429
        self.waiting += 1
        try:
            async with self.slots:
                self.waiting -= 1
                await asyncio.sleep(self.latency_s)
        except BaseException:
            self.waiting -= 1
            raise
        self.served += 1
        if path.startswith("/status/") and path[8:].isdigit():
            return int(path[8:])
        return 200


async def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--latency-ms", type=float, default=20.0)
    p.add_argument("--capacity", type=int, default=40)
    p.add_argument("--max-queue", type=int, default=2000)
    a = p.parse_args(argv)
    target = Target(a.latency_ms / 1000, a.capacity, a.max_queue)
    server = await asyncio.start_server(target.handle, "127.0.0.1", a.port, backlog=4096)
    port = server.sockets[0].getsockname()[1]
    print(f"listening on http://127.0.0.1:{port}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    try:
        import uvloop

        uvloop.run(main(sys.argv[1:]))
    except KeyboardInterrupt:
        pass
