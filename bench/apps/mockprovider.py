"""A mock SMS/email provider for the ``fanout`` scenario: standard library only
(asyncio streams, uvloop when installed), on loopback.

``POST /send?sender=S&id=N`` is one message of sender ``S``. Every sender has its own
token bucket (``--rate`` per second, ``--burst`` at most, full at the start): with a
token the message is accepted (200), without one the answer is 429 with
``Retry-After: <seconds>`` (decimal, the time until the sender's next token; at least
0.001). Either answer comes ``--latency-ms`` after the request (default 50 ms).
Keep-alive: any number of requests per connection, one at a time.

Which clock the bucket is judged on (``--clock``): ``sent`` (the default) is the
client's ``X-Sent`` header (``time.time()`` when the handler wrote the request; same
machine, same clock), ``arrival`` is when this process read the request. On a shared
2-core machine this process is sometimes descheduled for 100-300 ms; requests that
came in meanwhile are then read together, and an arrival-clock bucket answers 429 to
a burst the senders never sent. So by default the senders' own clock decides, and a
shadow bucket per sender on the other clock counts what it would have refused
(``limited_other_clock``), to show how much of it is this process's own stalls.

``GET /stats`` answers JSON: requests, accepted, limited (429s) and the first 1,000 of
them (sender, arrival, the sender's tokens then, the client's ``X-Sent`` time), distinct
ids accepted, ids accepted more than once (``doubles``, and up to 100 of them), and per
sender: accepted, limited, first and last accepted arrival (``time.time()``). Loop
stalls (the event loop turning more than 20 ms late) are listed too (time, seconds).
``POST /reset`` forgets everything (buckets full again).

    python -m bench.apps.mockprovider --rate 100 --burst 10      # prints "listening on URL"
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
    def __init__(self, rate: float, burst: float, latency_s: float,
                 clock: str = "sent") -> None:
        self.clock = clock
        self.rate = rate
        self.burst = burst
        self.latency_s = latency_s
        self.watcher: asyncio.Task[None] | None = None
        self.reset()

    def reset(self) -> None:
        self.buckets: dict[str, Bucket] = {}
        self.shadow: dict[str, Bucket] = {}  # the same buckets on the other clock
        self.limited_other = 0
        self.requests = 0
        self.accepted = 0
        self.limited = 0
        self.first_request = 0.0
        self.ids: dict[str, int] = {}
        # sender, arrival, its tokens then, when the client sent it (X-Sent, or 0)
        self.limited_at: list[tuple[str, float, float, float]] = []
        self.stalls: list[tuple[float, float]] = []  # (when, seconds) of loop stalls
        # sender -> [accepted, limited, first accepted arrival, last accepted arrival]
        self.senders: dict[str, list[Any]] = {}

    def take(self, buckets: dict[str, Bucket], sender: str, now: float) -> float:
        """0.0: a token was taken; otherwise the seconds until the next token. Times
        may come slightly out of order (X-Sent of requests on several connections): an
        earlier one adds no tokens."""
        b = buckets.get(sender)
        if b is None:
            b = buckets[sender] = Bucket(self.burst, now)
        if now > b.at:
            b.tokens = min(self.burst, b.tokens + (now - b.at) * self.rate)
            b.at = now
        if b.tokens >= 1.0:
            b.tokens -= 1.0
            return 0.0
        return max(0.001, (1.0 - b.tokens) / self.rate)

    def send(self, sender: str, mid: str, sent: float = 0.0) -> tuple[int, float]:
        now_wall = time.time()
        self.requests += 1
        if self.requests == 1:
            self.first_request = now_wall
        s = self.senders.get(sender)
        if s is None:
            s = self.senders[sender] = [0, 0, 0.0, 0.0]
        if self.clock == "sent" and sent:
            judge, other = sent, now_wall
        else:
            judge, other = now_wall, sent or now_wall
        wait = self.take(self.buckets, sender, judge)
        if self.take(self.shadow, sender, other):
            self.limited_other += 1
        if wait:
            self.limited += 1
            s[1] += 1
            if len(self.limited_at) < 1000:
                self.limited_at.append((sender, now_wall, self.buckets[sender].tokens, sent))
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
                "limited": self.limited, "clock": self.clock,
                "limited_other_clock": self.limited_other, "distinct": len(self.ids),
                "doubles": len(doubles), "double_ids": doubles[:100],
                "first_request": self.first_request, "now": time.time(),
                "limited_at": self.limited_at, "stalls": self.stalls[:1000],
                "rate": self.rate, "burst": self.burst, "latency_s": self.latency_s,
                "senders": {k: {"accepted": v[0], "limited": v[1], "first": v[2],
                                "last": v[3]} for k, v in self.senders.items()}}

    async def watch_loop(self, every_s: float = 0.005, stall_s: float = 0.02) -> None:
        """Notes each time this process's event loop turned ``stall_s`` late (it was
        descheduled or busy): requests read after a stall arrive bunched."""
        while True:
            t0 = time.monotonic()
            await asyncio.sleep(every_s)
            late = time.monotonic() - t0 - every_s
            if late > stall_s:
                self.stalls.append((time.time() - late, late))

    async def handle(self, reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                line = await reader.readline()
                if not line:
                    break
                length, sent = 0, 0.0
                while (h := await reader.readline()) not in (b"\r\n", b"\n", b""):
                    if h[:15].lower() == b"content-length:":
                        length = int(h[15:])
                    elif h[:7].lower() == b"x-sent:":
                        sent = float(h[7:])
                if length:
                    await reader.readexactly(length)
                parts = line.split()
                method = parts[0] if parts else b""
                target = parts[1].decode() if len(parts) > 1 else "/"
                u = urlsplit(target)
                extra = b""
                if u.path == "/send" and method == b"POST":
                    q = parse_qs(u.query)
                    status, wait = self.send(q.get("sender", ["-"])[0], q.get("id", ["-"])[0],
                                             sent)
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
    p.add_argument("--clock", choices=("sent", "arrival"), default="sent",
                   help="judge the buckets by the X-Sent header or by arrival")
    a = p.parse_args(argv)
    provider = Provider(a.rate, a.burst, a.latency_ms / 1000, a.clock)
    provider.watcher = asyncio.create_task(provider.watch_loop())
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
