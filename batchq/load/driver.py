"""The producer side of a load run: open or join it, send, watch, settle.

A run lives in Redis under its own hash tag (``keys.load_keys``). The process that
starts it writes the meta (task, arguments, profile, start time) with
``load_open.lua``; every producer joins it (the count of producers), sends its part
of the schedule and merges its figures once a second (``load_merge.lua``, whose reply
is the run's status: an abort reaches every producer within a second). Each job
carries ``[run id, intended send time]`` (``probe.LOAD_KWARG``), so workers measure
from when the job *should* have been sent.

The process that starts a run only watches it: its ``--producers N`` (default 1) are
child processes (``--join RUN --part k/N``) that split the schedule and do nothing but
send; ``--join RUN`` on another machine adds that
machine's sends (its own profile, or the run's when it gives none).

A run never outlasts its schedule by much: a producer that cannot keep up stops sending
``SEND_GRACE_S`` after the schedule's end and counts what it left (``unsent``), and the
run is then marked ``incomplete`` with the reason (``finish``), which makes the workers
acknowledge its jobs still queued without running them. Before a fast run, ``calibrate``
measures what one producer process sends here, so a rate out of reach is refused before
anything is sent.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..store.keys import LoadKeys
from ..store.scripts import calls
from .merge import RUN_TTL_S, RunData, Share, decode_hash, window
from .probe import LOAD_KWARG
from .profiles import WINDOW_S, AbortRule, describe, from_spec, to_spec
from .schedule import LoadState, Profile, aopen_loop

__all__ = ["Driver", "RunGone", "calibrate", "new_run_id", "out_of_reach", "peak_rate"]

PROGRESS_EVERY_S = 1.0
CHILD_LEAD_S = 2.0
"""The schedule starts this long after the run is opened: time for the producer processes
to start (a late one sends its backlog late, and its send lateness says so)."""
SEND_GRACE_S = 2.0
"""A producer sends nothing later than this after its schedule's end: what it has not
sent by then is counted as unsent, and the run reported incomplete."""
STOPPED = frozenset({"aborted", "incomplete", b"aborted", b"incomplete"})
"""Statuses of a run that is over: its producers stop, its queued jobs are skipped."""
CALIBRATE_S = 0.5
"""How long ``calibrate`` sends for."""
CALIBRATE_BATCH = 1000
"""Jobs per send while calibrating: the open loop's largest send."""


class RunGone(Exception):
    """The run to join does not exist (never started, or expired)."""


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(3)


@dataclass
class Driver:
    """One process's part in a run. ``task`` is a ``batchq.Task``; ``redis`` and
    ``scripts`` the app's asyncio client and scripts."""

    task: Any
    keys: LoadKeys
    run_id: str
    redis: Any
    scripts: Any
    rules: list[AbortRule] = field(default_factory=list)
    say: Callable[[str], None] = lambda line: None
    state: LoadState | None = None
    snapshots: deque[RunData] = field(default_factory=lambda: deque(maxlen=WINDOW_S + 1))
    abort_reason: str = ""

    # --- open / join -------------------------------------------------------------------

    async def open(self, profile: Profile, job_args: list[Any], job_kwargs: dict[str, Any],
                   lead_s: float, expected: int) -> float:
        """Create the run; returns its start time. ``ValueError`` if the id is taken."""
        start_s = time.time() + lead_s
        fields = [("task", self.task.name), ("queue", self.task.queue),
                  ("args", json.dumps({"args": job_args, "kwargs": job_kwargs})),
                  ("profile", to_spec(profile)), ("describe", describe(profile)),
                  ("start_s", repr(start_s)), ("expected", str(expected))]
        made = await self.scripts.call(calls.load_open(self.keys, "new", RUN_TTL_S * 1000,
                                                       fields))
        if not made:
            raise ValueError(f"a load run named {self.run_id!r} exists already")
        return start_s

    async def join(self) -> dict[str, str]:
        """Count this process as a producer; the run's meta. ``RunGone`` if none."""
        raw = await self.scripts.call(calls.load_open(self.keys, "join", RUN_TTL_S * 1000))
        if not raw:
            raise RunGone(f"no load run {self.run_id!r} (never started, or expired)")
        it = iter(raw)
        return decode_hash(dict(zip(it, it, strict=True)))

    # --- sending -----------------------------------------------------------------------

    async def produce(self, profile: Profile, job_args: list[Any], job_kwargs: dict[str, Any],
                      start_s: float, part: tuple[int, int] = (0, 1)) -> LoadState:
        """Send this producer's part of the schedule, merging its figures every second."""
        from ..produce.producer import Call

        st = self.state = self.state or LoadState(rate=profile.mean_rate,
                                                  duration_s=profile.duration_s)
        share = Share()
        sender = self.task.options(max_attempts=1)
        run_id = self.run_id

        async def send(intended: list[float], sent_at: float) -> None:
            try:
                if len(intended) == 1:
                    kw = {**job_kwargs, LOAD_KWARG: [run_id, int(intended[0] * 1e6)]}
                    await sender.aenqueue(*job_args, **kw)
                else:
                    await sender.aenqueue_many(
                        [Call(*job_args, **job_kwargs, **{LOAD_KWARG: [run_id, int(t * 1e6)]})
                         for t in intended])
            except Exception as exc:
                share.count("send_errors", len(intended))
                share.error(f"send: {type(exc).__name__}", str(exc))
                raise
            late = share.hists["l"]
            for t in intended:
                late.record(sent_at - t)
                share.second(t).sent += 1
            share.count("sent", len(intended))

        async def merge(final: bool) -> None:
            nonlocal share
            mine, share = share, share.taken()
            if final:
                mine.meta_incr["finished"] = 1
            try:
                status = await self.scripts.call(mine.call(self.keys))
            except Exception as exc:
                self.say(f"merging the producer's figures failed: {exc}")
                return
            if status is None or status in STOPPED:
                st.stopped = True

        async def merge_loop() -> None:
            while True:
                await asyncio.sleep(PROGRESS_EVERY_S)
                await merge(False)

        k, n = part
        everything = profile.total
        mine_total = max(0, -(-(everything - k) // n))
        share.count("scheduled", mine_total)
        share.count("offered_mrate", round(mine_total / profile.duration_s * 1000))
        merger = asyncio.create_task(merge_loop())
        try:
            await aopen_loop(send, profile.mean_rate, profile.duration_s, state=st,
                             profile=profile, part=part, start_s=start_s,
                             deadline_s=start_s + profile.duration_s + SEND_GRACE_S)
        finally:
            merger.cancel()
            await asyncio.gather(merger, return_exceptions=True)
            if not st.stopped and st.total > st.sent + st.errors:
                share.count("unsent", st.total - st.sent - st.errors)
            await merge(True)
        return st

    # --- watching ----------------------------------------------------------------------

    async def read(self, timeline: bool = False) -> RunData:
        pipe = self.redis.pipeline(transaction=False)
        pipe.hgetall(self.keys.meta)
        pipe.hgetall(self.keys.sum)
        if timeline:
            pipe.hgetall(self.keys.timeline)
        got = await pipe.execute()
        return RunData.parse(decode_hash(got[0]), decode_hash(got[1]),
                             decode_hash(got[2]) if timeline else None)

    async def watch_once(self) -> RunData:
        """Read the run, check the abort rules on the last seconds, report progress."""
        now = await self.read()
        before = self.snapshots[0] if len(self.snapshots) == self.snapshots.maxlen else None
        self.snapshots.append(now)
        hists, done, errors = window(now, before)
        if not self.abort_reason and now.meta.get("status") != "aborted":
            for rule in self.rules:
                why = rule.check(hists, done, errors)
                if why:
                    await self.abort(why)
                    break
        if now.meta.get("status") == "aborted" and self.state is not None:
            self.state.stopped = True
        late = now.hists["l"].percentile_s(99) * 1000
        self.say(f"sent {now.sent:,}  done {now.done:,}  errors {now.errors:,}  run p99 "
                 f"{hists['run'].percentile_s(99) * 1000:.1f} ms (last {WINDOW_S} s)  "
                 f"send lateness p99 {late:.2f} ms")
        return now

    async def abort(self, why: str) -> None:
        self.abort_reason = why
        await self._set_status("aborted", why)
        if self.state is not None:
            self.state.stopped = True
        self.say(f"aborting: {why}")

    async def finish(self, why: str) -> None:
        """End a run that did not go as scheduled: status ``incomplete`` with the
        reason; the workers acknowledge its jobs still queued without running them."""
        await self._set_status("incomplete", why)

    async def _set_status(self, status: str, why: str) -> None:
        share = Share()
        share.meta_set["status"] = status
        share.meta_set["reason"] = why
        await self.scripts.call(share.call(self.keys))

    async def watch(self, until: Callable[[], bool]) -> None:
        while not until():
            await asyncio.sleep(PROGRESS_EVERY_S)
            try:
                await self.watch_once()
            except Exception as exc:
                self.say(f"reading the run failed: {exc}")

    async def settle(self, limit_s: float) -> RunData:
        """Wait until every producer finished and every sent job was done (or skipped,
        after an abort), at most ``limit_s``; the run with its timeline."""
        deadline = time.monotonic() + limit_s
        while True:
            now = await self.read()
            expected = int(now.meta.get("expected", 0) or 0)
            finished = int(now.meta.get("finished", 0) or 0)
            settled = finished >= expected and now.finished_producers and \
                now.done + now.num("skipped") >= now.sent
            if settled or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        return await self.read(timeline=True)


async def calibrate(task: Any, job_args: list[Any], job_kwargs: dict[str, Any],
                    seconds: float = CALIBRATE_S) -> float:
    """Jobs per second one producer process sends here: ``task``'s jobs with these
    arguments, sent as fast as possible for ``seconds`` in the run's largest batches, to
    a scratch namespace of the same Redis, deleted afterwards."""
    from ..produce.producer import Call
    from ..store.keys import queues_key, shards_key
    from ..tasks.app import App

    scratch = App(task.app.redis_url, namespace=f"batchq-calibrate-{secrets.token_hex(4)}")
    scratch.redis_settings = task.app.redis_settings
    scratch.task(name=task.name, queue=task.queue)(lambda *a, **k: None)
    sender = scratch.tasks[task.name].options(max_attempts=1)
    batch = [Call(*job_args, **job_kwargs, **{LOAD_KWARG: ["calibrate", 0]})
             for _ in range(CALIBRATE_BATCH)]
    sent = 0
    t0 = time.perf_counter()
    try:
        while (elapsed := time.perf_counter() - t0) < seconds or not sent:
            await sender.aenqueue_many(batch)
            sent += len(batch)
        return sent / max(elapsed, 1e-6)
    finally:
        queue = scratch.queue(task.queue)
        for q in queue.shards():
            # its sequence counter too: nothing ever uses this namespace again
            await scratch.async_redis().delete(*q.keys.all(), q.keys.seq)
        for key in (queues_key(scratch.namespace), shards_key(scratch.namespace)):
            await scratch.async_redis().delete(key)  # one by one: not one slot
        await scratch.aclose()
        scratch.close()


def peak_rate(profile: Profile) -> float:
    """The profile's highest rate, jobs per second."""
    return max(max(r0, r1) for _, r0, r1 in profile.segments)


async def out_of_reach(task: Any, profile: Profile, producers: int, job_args: list[Any],
                       job_kwargs: dict[str, Any]) -> str:
    """Why ``producers`` producer processes on this machine cannot send the profile's
    peak rate ("" when they can), from a calibration of one of them."""
    peak = peak_rate(profile)
    # producers on one machine share its cores
    ceiling = await calibrate(task, job_args, job_kwargs) * min(producers,
                                                                os.cpu_count() or 1)
    if peak <= ceiling:
        return ""
    return (f"a peak rate of {peak:,.0f} jobs/s is beyond what {producers} producer "
            f"process(es) can send here: about {ceiling:,.0f} jobs/s (measured over "
            f"{CALIBRATE_S:g} s)")


def spawn_children(app_ref: str, task: str, run_id: str, n: int, redis_url: str
                   ) -> list[subprocess.Popen[bytes]]:
    """``--producers N``: N child producers of one run on this machine."""
    env = dict(os.environ)
    env["BATCHQ_REDIS_URL"] = redis_url  # not on the command line (it may hold a password)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return [subprocess.Popen(
        [sys.executable, "-m", "batchq", "bench", "load", app_ref, task, "--join", run_id,
         "--part", f"{k}/{n}"], env=env, stdin=subprocess.DEVNULL)
        for k in range(n)]


def profile_of(meta: dict[str, str]) -> Profile:
    return from_spec(meta["profile"])
