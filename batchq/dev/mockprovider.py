"""A minimal mock SMS provider for ``demo_sendtime``: standard library only, on loopback.

The same protocol as the fan-out benchmark's provider (``bench/apps/mockprovider.py``, which
the runtime package does not ship), reduced to what the demo needs: ``POST
/send?sender=S&id=N`` answers 200 (accepted, counted per sender and id) after
``latency_s``, or 503 while the provider is ``down``. ``send`` is the client side: one
request on a fresh connection (``asyncio`` streams), True when accepted.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from urllib.parse import parse_qs, urlsplit


class MockProvider:
    """One provider: ``await start()`` listens on 127.0.0.1 (a free port), ``url`` is
    where; ``down`` makes it answer 503; ``accepted`` counts ids accepted (a double send
    shows as a count of 2)."""

    def __init__(self, name: str, latency_s: float = 0.005) -> None:
        self.name = name
        self.latency_s = latency_s
        self.down = False
        self.accepted: Counter[str] = Counter()
        self.refused = 0
        self._server: asyncio.Server | None = None
        self.url = ""

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
                     ) -> None:
        try:
            line = await reader.readline()
            while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                pass  # headers: none matter here
            await asyncio.sleep(self.latency_s)
            query = parse_qs(urlsplit(line.split()[1].decode()).query) if line else {}
            if self.down:
                self.refused += 1
                status = b"503 Service Unavailable"
            else:
                self.accepted[query.get("id", [""])[0]] += 1
                status = b"200 OK"
            writer.write(b"HTTP/1.1 " + status + b"\r\ncontent-length: 0\r\n"
                         b"connection: close\r\n\r\n")
            await writer.drain()
        except (ConnectionError, IndexError, UnicodeDecodeError):
            pass
        finally:
            writer.close()


async def send(url: str, sender: str, mid: str) -> bool:
    """One message to the provider at ``url``: True when it answered 200."""
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    try:
        writer.write(f"POST /send?sender={sender}&id={mid} HTTP/1.1\r\nhost: "
                     f"{parts.netloc}\r\ncontent-length: 0\r\n\r\n".encode())
        await writer.drain()
        status = await reader.readline()
        return status.split()[1:2] == [b"200"]
    finally:
        writer.close()
