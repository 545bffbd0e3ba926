"""Issue 13's figure: the periodic scheduler over a long run, with a leader killed halfway.

``python -m bench.tools.periodic_takeover --minutes 10 --every-s 2`` from the repository root.

An embedded Valkey, then two supervisors ``batchq worker bench.tools.periodic_takeover:app
-p 2`` (real CLI processes, 4 worker processes; every one runs the scheduler). The
module's ``app`` (built from ``PERIODIC_NS`` / ``PERIODIC_EVERY_S`` in the workers'
environment) has one task, ``@app.periodic(every_s=...)``, whose handler pushes
``"<tick ms> <pid> <handler start ms>"`` (the tick is its job's ``Job.ready_ms``) to the
list ``<ns>:ticks``, outside the queue's keys.

The measured window starts once both supervisors have their 2 children serving; halfway
through it, just after a tick ran (so no job of it is left in the killed processes, as
in tests/periodic/test_periodic_takeover.py), the supervisor whose child leads (the leader
lock's owner, ``periodic_status``) is SIGKILLed, then each of its children. The other
takes over once the lock's lease (5 s) runs out. At the end the harness waits for the
last due tick to run, then stops the survivor with SIGTERM.

Figures: expected ticks (every multiple of ``every_s`` in the window), ticks run, ticks
run twice (must be 0), ticks missed (the scheduler skips ticks that fell due while no
process led, keeping only the latest: those inside the takeover window are expected,
any other is a failure), the longest gap between consecutive ticks run around the kill
(the takeover window, in tick time), and in handler wall time: kill to new leader, kill
to the first tick run after it, and the latest a tick ran after its due time (before
the kill, and around it). Writes ``bench/results/periodic-takeover-<timestamp>.json``
(the harness's record format) and prints a markdown table.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import batchq

NS_ENV = "PERIODIC_NS"
EVERY_ENV = "PERIODIC_EVERY_S"
TASK = "periodic_takeover.beat"
APP_REF = "bench.tools.periodic_takeover:app"


def ticks_key(namespace: str) -> str:
    return f"{namespace}:ticks"


def build(namespace: str, redis_url: str | None = None, every_s: float = 2.0) -> batchq.App:
    """The app (the harness builds its own copy: same periodic task, same leader lock)."""
    app = batchq.App(redis_url, namespace=namespace)
    key = ticks_key(namespace)

    @app.periodic(every_s=every_s, batch_size=1, name=TASK)
    async def beat(jobs: list[batchq.Job]) -> None:
        start_ms = int(time.time() * 1000)
        for job in jobs:
            await app.async_redis().rpush(key, f"{job.ready_ms} {os.getpid()} {start_ms}")

    return app


_ns = os.environ.get(NS_ENV)
app = build(_ns, every_s=float(os.environ.get(EVERY_ENV, "2"))) if _ns else None


# --- the harness side -----------------------------------------------------------------


def _server_ms(r: Any) -> int:
    sec, usec = r.time()
    return int(sec) * 1000 + int(usec) // 1000


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def _worker_argv() -> list[str]:
    exe = Path(sys.executable).parent / "batchq"
    cli = [str(exe)] if exe.exists() else [sys.executable, "-m", "batchq"]
    return [*cli, "worker", APP_REF, "-p", "2", "--no-metrics", "--log-level", "INFO"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.tools.periodic_takeover",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=10.0,
                   help="length of the measured window (default 10)")
    p.add_argument("--every-s", type=float, default=2.0,
                   help="the periodic task's every_s (default 2)")
    p.add_argument("--out-dir", type=Path, default=None,
                   help="where the JSON record goes (default bench/results)")
    p.add_argument("--note", action="append", default=[],
                   help="a remark to keep in the record (repeatable)")
    args = p.parse_args(argv)

    from batchq.produce.periodic import LEASE_S, periodic_status
    from bench.harness import Context, Fleet, Row, finish_record, fmt, new_record, process_tree

    every_ms = round(args.every_s * 1000)
    duration_s = args.minutes * 60
    with contextlib.ExitStack() as stack:
        ctx = stack.enter_context(Context(None))
        ns = ctx.namespace
        papp = build(ns, ctx.url, args.every_s)
        stack.callback(papp.close)
        r = ctx.client
        key = ticks_key(ns)

        def leader() -> int | None:
            owner = periodic_status(papp)[0]["leader"]
            return None if owner is None else int(owner.rsplit(":", 1)[1])

        def runs() -> list[tuple[int, int, int]]:
            return [(int(a), int(b), int(c)) for a, b, c in
                    (raw.split() for raw in r.lrange(key, 0, -1))]

        def until(pred: Any, timeout_s: float, what: str) -> Any:
            deadline = time.monotonic() + timeout_s
            while True:
                got = pred()
                if got:
                    return got
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{what}: not within {timeout_s:g}s\n" + "\n".join(
                        f"--- supervisor {s.pid}\n{s.log_tail()}" for s in sups))
                time.sleep(0.05)

        env = ctx.fleet_env(**{NS_ENV: ns, EVERY_ENV: repr(args.every_s)})
        sups: list[Fleet] = []
        for _ in range(2):
            f = Fleet(_worker_argv(), env)
            stack.enter_context(f)
            sups.append(f.start())
        seen: set[int] = set()

        def serving(f: Fleet) -> set[int]:
            kids = set(process_tree(f.pid)) - {f.pid}
            seen.update(kids)
            text = f.log_path.read_text(errors="replace")
            pids = {int(t) for line in text.splitlines() if " serving " in line
                    for t in [line.split(" serving ", 1)[0].rsplit(":", 1)[-1]] if t.isdigit()}
            return kids & pids

        for f in sups:
            until(lambda f=f: len(serving(f)) == 2 or not f.running(), 60,
                  f"2 serving children of {f.pid}")
            if not f.running():
                code = f.proc and f.proc.returncode
                raise RuntimeError(f"supervisor exited {code}\n{f.log_tail()}")
        t0_ms = _server_ms(r)
        t0 = time.monotonic()
        print(f"# both supervisors serve ({sorted(serving(sups[0]))}, "
              f"{sorted(serving(sups[1]))}); window of {args.minutes:g} min, "
              f"every_s={args.every_s:g}", file=sys.stderr, flush=True)

        # first half, then kill just after a tick ran
        leaders: list[tuple[int, int | None]] = []

        def watch_leader() -> int | None:
            ld = leader()
            if not leaders or leaders[-1][1] != ld:
                leaders.append((_server_ms(r), ld))
            return ld

        while time.monotonic() - t0 < duration_s / 2:
            watch_leader()
            time.sleep(0.5)
        n = r.llen(key)
        until(lambda: r.llen(key) > n, every_ms / 1000 + LEASE_S + 5, "a tick before the kill")
        time.sleep(0.3)
        old = until(watch_leader, LEASE_S + 5, "a leader")
        [victim] = [f for f in sups if old in process_tree(f.pid)]
        [survivor] = [f for f in sups if f is not victim]
        kids = set(process_tree(victim.pid)) - {victim.pid}
        assert victim.proc is not None
        kill_ms = _server_ms(r)
        kill_wall_ms = int(time.time() * 1000)
        os.kill(victim.pid, signal.SIGKILL)
        victim.proc.wait(10)
        kids |= {pid for pid in seen if _alive(pid) and pid not in process_tree(survivor.pid)}
        for pid in kids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        until(lambda: not any(_alive(pid) for pid in kids), 10, "killed children gone")
        killed = kids | {victim.pid}
        print(f"# killed supervisor {victim.pid} and {sorted(kids)} (leader {old}) at "
              f"{(kill_ms - t0_ms) / 1000:.1f}s", file=sys.stderr, flush=True)
        new = until(lambda: (ld := watch_leader()) not in (None, old) and ld,
                    LEASE_S + 10, "another process leads")
        new_leader_ms = _server_ms(r) - kill_ms
        if new not in process_tree(survivor.pid):
            raise RuntimeError(f"new leader {new} is not the survivor's child")

        # second half, then wait for the last due tick and stop the survivor
        while time.monotonic() - t0 < duration_s:
            watch_leader()
            time.sleep(0.5)
        end_tick = _server_ms(r) // every_ms * every_ms
        with contextlib.suppress(RuntimeError):
            until(lambda: any(t >= end_tick for t, _, _ in runs()),
                  every_ms / 1000 + LEASE_S + 5, "the last due tick")
        survivor.stop(signal.SIGTERM, timeout_s=20)
        survivor_exit = survivor.proc.returncode if survivor.proc else None

        # figures
        everything = runs()
        first_tick = (t0_ms // every_ms + 1) * every_ms
        expected = list(range(first_tick, end_tick + 1, every_ms))
        inside = [(t, pid, s) for t, pid, s in everything if first_tick <= t <= end_tick]
        ticks = sorted({t for t, _, _ in inside})
        counts: dict[int, int] = {}
        for t, _, _ in everything:
            counts[t] = counts.get(t, 0) + 1
        twice = sorted(t for t, c in counts.items() if c > 1)
        missed = sorted(set(expected) - set(ticks))
        off_grid = sorted(t for t in ticks if t % every_ms)
        before = [t for t in ticks if t < kill_ms]
        after = [t for t in ticks if t > kill_ms]
        last_before = max(before) if before else first_tick
        first_after = min(after) if after else end_tick
        takeover_gap_ms = first_after - last_before
        missed_in_takeover = [t for t in missed if last_before < t < first_after]
        missed_elsewhere = [t for t in missed if not last_before < t < first_after]
        gaps = [b - a for a, b in itertools.pairwise(ticks)]
        longest_gap_ms = max(gaps) if gaps else 0
        late = {t: s - t for t, _, s in inside}
        first_after_run = min((s for t, _, s in inside if s > kill_wall_ms), default=None)
        kill_to_run_ms = None if first_after_run is None else first_after_run - kill_wall_ms
        late_before = max((v for t, v in late.items() if t < last_before), default=0)
        late_around = max((v for t, v in late.items() if last_before <= t <= first_after),
                          default=0)
        ran_after_in_killed = [pid for t, pid, _ in inside if t > kill_ms and pid in killed]
        stats = papp.queue("default").stats()
        enqueued = int(r.hget(papp.keys("default").stats, "enqueued") or 0)

        rec = new_record(ctx, "periodic-takeover", {
            "minutes": args.minutes, "every_s": args.every_s, "supervisors": 2,
            "processes_per_supervisor": 2, "lease_s": LEASE_S,
            "worker_argv": _worker_argv(), "note": args.note})
        row = Row("2 supervisors x -p 2, one SIGKILLed halfway",
                  {"every_s": args.every_s, "minutes": args.minutes})
        figures = [
            ("expected ticks", len(expected), "ticks"),
            ("ticks run", len(ticks), "ticks"),
            ("ticks run twice", len(twice), "ticks"),
            ("ticks missed", len(missed), "ticks"),
            ("missed inside the takeover window", len(missed_in_takeover), "ticks"),
            ("missed outside the takeover window", len(missed_elsewhere), "ticks"),
            ("longest gap between ticks run", longest_gap_ms / 1000, "s"),
            ("takeover window (gap around the kill)", takeover_gap_ms / 1000, "s"),
            ("kill to new leader", new_leader_ms / 1000, "s"),
            ("kill to first tick run", (kill_to_run_ms or 0) / 1000, "s"),
            ("max tick lateness before the kill", late_before / 1000, "s"),
            ("max tick lateness around the kill", late_around / 1000, "s"),
        ]
        for name, value, unit in figures:
            row.add(name, value, unit)
        ok = (not twice and not missed_elsewhere and not off_grid and not ran_after_in_killed
              and takeover_gap_ms <= (LEASE_S * 1000 + 2 * every_ms))
        rec["runs"].append({
            "ok": ok, "t0_ms": t0_ms, "kill_ms": kill_ms, "end_tick_ms": end_tick,
            "killed_pids": sorted(killed), "old_leader": old, "new_leader": new,
            "leader_changes": leaders, "survivor_exit": survivor_exit,
            "ticks_twice": twice, "ticks_missed": missed, "ticks_off_grid": off_grid,
            "ran_after_kill_in_killed_pids": ran_after_in_killed,
            "queue_after": {"ready": stats.ready, "delayed": stats.delayed,
                            "reserved": stats.reserved, "dead": stats.dead},
            "enqueued": enqueued, "records": len(everything),
            "runs": [list(x) for x in everything],
        })
        out = finish_record(rec, args.out_dir or ctx.out_dir, [row], ctx)

    lines = [f"### periodic-takeover — {rec['timestamp']}", "",
             f"{args.minutes:g} min, every_s={args.every_s:g}, 2 supervisors `batchq worker "
             f"-p 2`, the leader's supervisor and children SIGKILLed at "
             f"{(kill_ms - t0_ms) / 1000:.0f} s; lease {LEASE_S:g} s", "",
             "| figure | value |", "|---|---|"]
    for name, value, unit in figures:
        shown = f"{value:.0f}" if unit == "ticks" else f"{fmt(value, unit)} s"
        lines.append(f"| {name} | {shown} |")
    lines += ["",
              f"- {'PASS' if ok else 'FAIL'}: run twice {len(twice)}, missed outside the "
              f"takeover window {len(missed_elsewhere)}, off the grid {len(off_grid)}, run "
              f"by a killed pid after the kill {len(ran_after_in_killed)}",
              f"- missed inside the takeover window: "
              f"{[(t - kill_ms) / 1000 for t in missed_in_takeover]} s after the kill "
              f"(the scheduler runs only the latest due tick after a takeover)",
              f"- queue after: ready {stats.ready}, delayed {stats.delayed}, reserved "
              f"{stats.reserved}, dead {stats.dead}; enqueued {enqueued}, handler runs "
              f"{len(everything)}; survivor exit {survivor_exit}",
              f"- record: {out}"]
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
