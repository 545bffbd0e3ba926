"""``make demo-sendtime``: send-time control on one queue of text messages, then checked.

``python -m batchq.dev.demo_sendtime [--code-ttl-s S] [--timeout-s S]``. Without
``$BATCHQ_REDIS_URL`` an embedded Valkey is started for the run; the namespace is the
run's own and is deleted at the end. Two mock SMS providers (``mockprovider.py``, the
fan-out benchmark's provider reduced to what this needs) listen on loopback: "twilio",
down for the whole run, and "vonage". One in-process worker serves the ``sms`` queue:

- customer ``acme`` has a daily quota (``q.limit(group="acme", max_per_day=5,
  tz="America/New_York")``): 8 messages are queued, 5 go today, 3 wait in Redis for the
  next day in New York;
- customer ``nightowl`` has quiet hours (``q.window(group="nightowl", hours=...,
  tz="Europe/Paris")``, a window that is closed now): its 2 messages wait for the opening;
- the bulk messages of ``globex`` go through ``send_sms``, bound to circuit breaker
  "twilio" with the fallback ``send_sms_vonage``: twilio fails, the breaker opens after
  3 failures, and the rest is re-routed to vonage, each message accepted exactly once;
- a one-time code (``options(expires_s=...)``) that nobody sent in time expires: it never
  runs and is counted ``expired``; a fresh one is sent.

Exit code 0 only when every one of these is what the run saw.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import time
import uuid
from collections.abc import Sequence
from datetime import datetime
from zoneinfo import ZoneInfo

import redis

from .. import App, Worker, WorkerSettings
from ..store.connection import redact
from .mockprovider import MockProvider, send
from .server import EmbeddedServer

QUEUE = "sms"
QUOTA = 5
ACME_MESSAGES = 8
NIGHTOWL_MESSAGES = 2
GLOBEX_MESSAGES = 12
FAILURES = 3


class ProviderDown(ConnectionError):
    """The provider answered something else than 200."""


def closed_hours(tz: str, now: datetime | None = None) -> str:
    """A one-hour window ("HH:00-HH:00") that starts two hours from now in ``tz``:
    closed now, whatever the time of day."""
    h = (now or datetime.now(ZoneInfo(tz))).astimezone(ZoneInfo(tz)).hour
    return f"{(h + 2) % 24:02d}:00-{(h + 3) % 24:02d}:00"


def make_app(redis_url: str, namespace: str, twilio: MockProvider, vonage: MockProvider
             ) -> App:
    """The demo's tasks on queue ``sms``: ``notify`` (vonage), ``send_sms`` (twilio, behind
    breaker "twilio", fallback ``send_sms_vonage``) and ``send_code`` (vonage)."""
    app = App(redis_url, namespace)
    app.breaker("twilio", failures=FAILURES, within_s=30, open_s=60, half_open_jobs=1,
                exceptions=(ProviderDown,))

    async def deliver(p: MockProvider, sender: str, mid: str) -> None:
        if not await send(p.url, sender, mid):
            raise ProviderDown(f"{p.name} refused message {mid}")

    @app.task(queue=QUEUE, max_attempts=3, retry_backoff_s=0.05)
    async def send_sms_vonage(customer: str, mid: str) -> None:
        await deliver(vonage, customer, mid)

    @app.task(queue=QUEUE, breaker="twilio", fallback=send_sms_vonage, max_attempts=10,
              retry_backoff_s=0.05, retry_backoff_max_s=0.2)
    async def send_sms(customer: str, mid: str) -> None:
        async with app.breaker("twilio"):
            await deliver(twilio, customer, mid)

    @app.task(queue=QUEUE, max_attempts=3, retry_backoff_s=0.05)
    async def notify(customer: str, mid: str) -> None:
        await deliver(vonage, customer, mid)

    @app.task(queue=QUEUE, max_attempts=3, retry_backoff_s=0.05)
    async def send_code(phone: str, code: str) -> None:
        await deliver(vonage, "codes", f"code-{code}")

    return app


def _by(p: MockProvider, prefix: str) -> int:
    return sum(n for mid, n in p.accepted.items() if mid.startswith(prefix))


async def scenario(app: App, twilio: MockProvider, vonage: MockProvider,
                   code_ttl_s: float, timeout_s: float) -> list[str]:
    """Set up, enqueue, serve and check; returns the problems found (none: success)."""
    q = app.queue(QUEUE)
    problems: list[str] = []
    q.limit(group="acme", max_per_day=QUOTA, tz="America/New_York")
    print(f"quota    acme: at most {QUOTA} messages a day, days of America/New_York")
    hours = closed_hours("Europe/Paris")
    q.window(group="nightowl", hours=hours, tz="Europe/Paris")
    print(f"window   nightowl: only {hours} Europe/Paris (closed now)")
    twilio.down = True
    print(f"breaker  twilio: opens after {FAILURES} failures; send_sms falls back to "
          "send_sms_vonage (twilio is down for this run)")
    notify, send_sms, send_code = (app.tasks[n] for n in ("notify", "send_sms", "send_code"))
    notify.options(group="acme").enqueue_many(
        [("acme", f"acme-{i}") for i in range(ACME_MESSAGES)])
    notify.options(group="nightowl").enqueue_many(
        [("nightowl", f"nightowl-{i}") for i in range(NIGHTOWL_MESSAGES)])
    send_sms.enqueue_many([("globex", f"globex-{i}") for i in range(GLOBEX_MESSAGES)])
    send_code.options(expires_s=code_ttl_s).enqueue("+15550100", "111111")
    print(f"code     one-time code 111111 expires in {code_ttl_s:g} s; no worker runs yet")
    await asyncio.sleep(code_ttl_s + 0.2)
    send_code.options(expires_s=300).enqueue("+15550100", "222222")
    print("code     a fresh code 222222 (expires in 300 s); the worker starts")

    worker = Worker(app, WorkerSettings(queues=(QUEUE,), concurrency=8,
                                        install_signal_handlers=False, metrics=False))
    run = asyncio.create_task(worker.run())
    deadline = time.monotonic() + timeout_s

    def done() -> bool:
        return (_by(vonage, "acme") >= QUOTA and vonage.accepted["code-222222"] >= 1
                and _by(twilio, "globex") + _by(vonage, "globex") >= GLOBEX_MESSAGES
                and q.stats().expired >= 1)

    try:
        while not done() and time.monotonic() < deadline and not run.done():
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)  # anything more that would go, goes now
    finally:
        worker.request_stop()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(run, 30)
    st = q.stats()
    acme = _by(vonage, "acme")
    print(f"result   acme: {acme} sent, {ACME_MESSAGES - acme} wait for the next day")
    if acme != QUOTA:
        problems.append(f"acme sent {acme}, its daily quota is {QUOTA}")
    owl = _by(vonage, "nightowl")
    print(f"result   nightowl: {owl} sent, {NIGHTOWL_MESSAGES - owl} wait for {hours}")
    if owl:
        problems.append(f"nightowl sent {owl} outside its window")
    state = app.breakers["twilio"].state()
    moved = int(app.redis.hget(app.keys(QUEUE).stats, "rerouted:send_sms") or 0)
    ids = [f"globex-{i}" for i in range(GLOBEX_MESSAGES)]
    once = all(twilio.accepted[m] + vonage.accepted[m] == 1 for m in ids)
    print(f"result   breaker twilio {state.state} after {twilio.refused} failures; "
          f"{moved} messages re-routed to vonage; every globex message accepted "
          f"{'exactly once' if once else 'NOT exactly once'}")
    if state.state != "open" or moved < 1 or not once:
        problems.append(f"breaker: state {state.state}, rerouted {moved}, exactly once {once}")
    print(f"result   codes: {st.expired} expired (never sent), fresh code sent "
          f"{vonage.accepted['code-222222']} time(s)")
    if st.expired != 1 or vonage.accepted["code-111111"] or \
            vonage.accepted["code-222222"] != 1:
        problems.append(f"codes: expired {st.expired}, old sent "
                        f"{vonage.accepted['code-111111']}, fresh sent "
                        f"{vonage.accepted['code-222222']}")
    waiting = ACME_MESSAGES - QUOTA + NIGHTOWL_MESSAGES
    if st.pending != waiting or st.dead:
        problems.append(f"expected {waiting} jobs waiting and none dead, got {st}")
    return problems


async def _main(redis_url: str, code_ttl_s: float, timeout_s: float) -> int:
    twilio, vonage = MockProvider("twilio"), MockProvider("vonage")
    await twilio.start()
    await vonage.start()
    namespace = f"sendtime{uuid.uuid4().hex[:8]}"
    app = make_app(redis_url, namespace, twilio, vonage)
    print(f"queue    {QUEUE!r} in namespace {namespace!r}; providers twilio {twilio.url}, "
          f"vonage {vonage.url}")
    try:
        problems = await scenario(app, twilio, vonage, code_ttl_s, timeout_s)
    finally:
        await twilio.close()
        await vonage.close()
        keys = list(app.redis.scan_iter(match=f"{namespace}:*", count=1000))
        for i in range(0, len(keys), 500):
            app.redis.delete(*keys[i:i + 500])
        app.close()
    if problems:
        print(f"FAILED: {'; '.join(problems)}", file=sys.stderr)
        return 1
    print("check    quota, quiet hours, breaker fallback and expiry: OK")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m batchq.dev.demo_sendtime",
                                description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--code-ttl-s", type=float, default=2.0,
                   help="the one-time code's expires_s (default 2)")
    p.add_argument("--timeout-s", type=float, default=60.0,
                   help="give up when the run has not settled by then (default 60)")
    args = p.parse_args(argv)
    if not 0 < args.code_ttl_s <= 60 or not 1 <= args.timeout_s <= 3600:
        print("--code-ttl-s must be in (0, 60], --timeout-s in [1, 3600]", file=sys.stderr)
        return 2
    print("batchq send-time demo: a daily quota, quiet hours, a breaker with a fallback "
          "and an expiring code")
    url = os.environ.get("BATCHQ_REDIS_URL")
    try:
        if url:
            print(f"redis    {redact(url)} (from $BATCHQ_REDIS_URL)")
            return asyncio.run(_main(url, args.code_ttl_s, args.timeout_s))
        with EmbeddedServer() as server:
            print(f"redis    embedded Valkey at {server.url} (stopped at the end)")
            return asyncio.run(_main(server.url, args.code_ttl_s, args.timeout_s))
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        print(f"\nFAILED: cannot reach Redis: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

