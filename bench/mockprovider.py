"""A mock SMS/email provider for the ``fanout`` scenario: standard library only
(asyncio streams, uvloop when installed), on loopback.

``POST /send?sender=S&id=N`` is one message of sender ``S``. Every sender has its own
token bucket (``--rate`` per second, ``--burst`` at most, full at the start), checked
when the request arrives: with a token the message is accepted (200), without one the
answer is 429 with ``Retry-After: <seconds>`` (decimal, the time until the sender's
next token; at least 0.001). Either answer comes ``--latency-ms`` after the request
(default 50 ms). Keep-alive: any number of requests per connection, one at a time.

``GET /stats`` answers JSON: requests, accepted, limited (429s) and the first 1,000 of
them (sender, arrival, the sender's tokens then), distinct ids accepted, ids accepted
more than once (``doubles``, and up to 100 of them), and per
sender: accepted, limited, first and last accepted arrival (``time.time()``).
``POST /reset`` forgets everything (buckets full again).

    python -m bench.mockprovider --rate 100 --burst 10      # prints "listening on URL"
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any
from urllib.parse import parse_qs, urlsplit


class Bucket:
    __slots__ = ("at", "tokens")

    def __init__(self, burst: float, now: float) -> None:
        self.tokens = burst
        self.at = now


class Provider:
    def __init__(self, rate: float, burst: float, latency_s: float) -> None:
        self.rate = rate
        self.burst = burst
        self.latency_s = latency_s
        self.reset()

    def reset(self) -> None:
        self.buckets: dict[str, Bucket] = {}
        self.requests = 0
        self.accepted = 0
        self.limited = 0
        self.first_request = 0.0
        self.ids: dict[str, int] = {}
        self.limited_at: list[tuple[str, float, float]] = []  # sender, arrival, tokens
        # sender -> [accepted, limited, first accepted arrival, last accepted arrival]
        self.senders: dict[str, list[Any]] = {}

    def take(self, sender: str, now: float) -> float:
        """0.0: a token was taken; otherwise the seconds until the next token."""
        b = self.buckets.get(sender)
        if b is None:
            b = self.buckets[sender] = Bucket(self.burst, now)
        b.tokens = min(self.burst, b.tokens + (now - b.at) * self.rate)
        b.at = now
        if b.tokens >= 1.0:
            b.tokens -= 1.0
            return 0.0
        return max(0.001, (1.0 - b.tokens) / self.rate)

    def send(self, sender: str, mid: str) -> tuple[int, float]:
        now_wall = time.time()
        self.requests += 1
        if self.requests == 1:
            self.first_request = now_wall
        s = self.senders.get(sender)
        if s is None:
            s = self.senders[sender] = [0, 0, 0.0, 0.0]
        wait = self.take(sender, time.monotonic())
        if wait:
            self.limited += 1
            s[1] += 1
            if len(self.limited_at) < 1000:
                self.limited_at.append((sender, now_wall, self.buckets[sender].tokens))
            return 429, wait
        self.accepted += 1
        self.ids[mid] = self.ids.get(mid, 0) + 1
        if s[0] == 0:
            s[2] = now_wall
        s[0] += 1
        s[3] = now_wall
        return 200, 0.0

    def stats(self) -> dict[str, Any]:
        doubles = [m for m, n in self.ids.items() if n > 1]
        return {"requests": self.requests, "accepted": self.accepted,
                "limited": self.limited, "distinct": len(self.ids),
                "doubles": len(doubles), "double_ids": doubles[:100],
                "first_request": self.first_request, "now": time.time(),
                "limited_at": self.limited_at,
                "rate": self.rate, "burst": self.burst, "latency_s": self.latency_s,
                "senders": {k: {"accepted": v[0], "limited": v[1], "first": v[2],
                                "last": v[3]} for k, v in self.senders.items()}}

    async def handle(self, reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                line = await reader.readline()
                if not line:
                    break
                length = 0
                while (h := await reader.readline()) not in (b"\r\n", b"\n", b""):
                    if h[:15].lower() == b"content-length:":
                        length = int(h[15:])
                if length:
                    await reader.readexactly(length)
                parts = line.split()
                method = parts[0] if parts else b""
                target = parts[1].decode() if len(parts) > 1 else "/"
                u = urlsplit(target)
                extra = b""
                if u.path == "/send" and method == b"POST":
                    q = parse_qs(u.query)
                    status, wait = self.send(q.get("sender", ["-"])[0], q.get("id", ["-"])[0])
                    await asyncio.sleep(self.latency_s)
                    body = b"ok\n" if status == 200 else b"too many\n"
                    if status == 429:
                        extra = b"Retry-After: %.3f\r\n" % wait
                elif u.path == "/stats":
                    status, body = 200, json.dumps(self.stats()).encode()
                elif u.path == "/reset" and method == b"POST":
                    self.reset()
                    status, body = 200, b"ok\n"
                else:
                    status, body = 404, b"not found\n"
                writer.write(b"HTTP/1.1 %d X\r\n%sContent-Length: %d\r\n\r\n%s"
                             % (status, extra, len(body), body))
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            pass
        finally:
            writer.close()


async def serve(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--rate", type=float, default=100.0, help="messages/s per sender")
    p.add_argument("--burst", type=float, default=10.0, help="bucket size per sender")
    p.add_argument("--latency-ms", type=float, default=50.0)
    a = p.parse_args(argv)
    provider = Provider(a.rate, a.burst, a.latency_ms / 1000)
    server = await asyncio.start_server(provider.handle, "127.0.0.1", a.port, backlog=4096)
    port = server.sockets[0].getsockname()[1]
    print(f"listening on http://127.0.0.1:{port}", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    try:
        import uvloop

        uvloop.run(serve(argv))
    except ImportError:  # pragma: no cover
        asyncio.run(serve(argv))
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
