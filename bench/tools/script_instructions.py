"""Server instructions (valgrind callgrind) inside one script call, for source trees.

``python -m bench.tools.script_instructions TREE [TREE ...] [--calls N] [--jobs N]
[--evalsha]``

Timings on a shared 2-core box swing with whatever else runs; the instructions the server
executes inside a script command do not. One valkey-server runs under ``valgrind
--tool=callgrind``, counting only inside ``FCALL``, ``EVALSHA`` and ``EVAL`` (toggle
collection on their command functions: the command's parsing and reply writing are
outside). For each tree, each script is loaded the tree's own way (a function library
for a tree that calls its scripts as Redis Functions, else the script text; ``--evalsha``
sends every tree's text by EVALSHA), then:

* **empty pop**: the pop by which an idle worker registers for hand-off (``--calls``);
* **enqueue 1**: a one-job enqueue that finds nobody registered (``--calls``);
* **pop /job, ack /job**: ``--jobs`` plain jobs popped 100 a call as a worker pops (a
  pop's plain jobs leased in one bundle), then acked (per job).

Each row runs on a server of its own, started for it: the Lua heap of a server that ran
other scripts before makes every call's garbage collection dearer (the same EVALSHA pop
measured 1.5 times the instructions on a server that had run another tree's scripts).
Prints instructions per call (per job for the last two) and each row's ratio to the
first row's. Needs valgrind; the server runs ~50 times slower, so keep the counts small.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import os
import re
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import redis

from batchq.dev.server import binary_path, pick_free_port
from batchq.store.keys import QueueKeys
from batchq.store.scripts import calls
from bench.apps import make_app
from bench.tools.flow_cost import loaded
from bench.tools.script_cost import script_source

CASES = ("empty pop", "enqueue 1", "pop /job", "ack /job")
_TOGGLES = ("fcallCommand", "evalShaCommand", "evalCommand")


class Counter:
    """The callgrind counters of one valgrind'ed server."""

    def __init__(self, pid: int, out: str) -> None:
        self.pid, self.out = pid, out

    def zero(self) -> None:
        subprocess.run(["callgrind_control", "-z", str(self.pid)], check=True,
                       capture_output=True)

    def read(self) -> int:
        subprocess.run(["callgrind_control", "-d", str(self.pid)], check=True,
                       capture_output=True)
        time.sleep(0.3)
        last = max(glob.glob(os.path.join(self.out, "cg.out.*")), key=os.path.getmtime)
        with open(last, encoding="utf-8") as f:
            m = re.search(r"^(?:summary|totals):\s+(\d+)", f.read(), re.M)
        return int(m.group(1)) if m else 0


def measure(r: Any, url: str, counter: Counter, tree: Path, functions: bool, n_calls: int,
            n_jobs: int) -> dict[str, float]:
    text = {name: script_source(tree, name, functions) for name in ("pop", "ack", "enqueue")}
    run = {name: loaded(r, t) for name, t in text.items()}
    ns = f"si{uuid.uuid4().hex[:8]}"
    k = QueueKeys(ns, "q")
    out: dict[str, float] = {}
    counter.zero()
    for _ in range(n_calls):
        c = calls.pop(k, 100, 30_000, 100, "bench", 6_000)
        run["pop"](c.keys, c.args)
    out["empty pop"] = counter.read() / n_calls
    r.delete(k.idle)
    first = int(r.incrby(k.seq, n_calls)) - n_calls
    counter.zero()
    for i in range(n_calls):
        jid = f"{'a' * 17}-{first + i:x}"
        c = calls.enqueue(k, 0, [f"0:0:3:{jid}:".encode() + b"\x94\xa1t\x90\x80\x00"],
                          check=False, runs=f"{first + i}:1")
        run["enqueue"](c.keys, c.args)
    out["enqueue 1"] = counter.read() / n_calls
    app = make_app(url, ns)
    app.queue("bench").clear()
    qk = app.keys("bench")
    app.queue("bench").clear()
    app.tasks["noop"].enqueue_many(range(n_jobs))
    leases: list[list[bytes]] = []
    counter.zero()
    while True:  # as a worker pops: the plain jobs of a pop in one bundle
        c = calls.pop(qk, 100, 600_000, 100, bundle=True)
        res = run["pop"](c.keys, c.args)
        # the reply's 11th item is the bundle, {name, n} or {} (a tree without bundles:
        # the jobs begin there)
        head = 11 if len(res) > 10 and isinstance(res[10], list) else 10
        got = res[head:]
        if not got:
            break
        n = int(res[10][1]) if head == 11 and res[10] else 0
        leases.append([j.split(b":", 4)[3] + b":" + j.split(b":", 4)[1]
                       for j in got[: len(got) - n]]
                      + [res[10][0] + p.to_bytes(2, "big") for p in range(1, n + 1)])
    out["pop /job"] = counter.read() / n_jobs
    grouped = "<bundle>#<position>" in text["ack"]  # an older ack: one argument a lease
    counter.zero()
    for batch in leases:
        c = calls.ack(qk, batch)
        run["ack"](c.keys, c.args if grouped else batch)
    out["ack /job"] = counter.read() / n_jobs
    app.queue("bench").clear()
    app.close()
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.tools.script_instructions",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trees", nargs="+", type=Path)
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--jobs", type=int, default=5_000)
    p.add_argument("--evalsha", action="store_true",
                   help="send every tree's scripts by EVALSHA (default: each tree's way)")
    p.add_argument("--both", action="store_true",
                   help="each tree its own way, and by EVALSHA too")
    a = p.parse_args(argv)
    if not (shutil.which("valgrind") and shutil.which("callgrind_control")):
        raise SystemExit("needs valgrind (callgrind_control)")
    ways = [False] if a.evalsha else ([True, False] if a.both else [True])
    rows = [(t.resolve(), fn) for t in a.trees for fn in ways]
    got = [on_fresh_server(t, fn, a.calls, a.jobs) for t, fn in rows]
    print(f"server instructions inside the script command, {a.calls} calls, "
          f"{a.jobs:,} jobs; a fresh server per row")
    print("| tree | way | " + " | ".join(CASES) + " | ÷ first: " + " | ".join(CASES)
          + " |")
    print("|---|---|" + "---|" * (2 * len(CASES)))
    for (t, fn), res in zip(rows, got, strict=True):
        way = "own" if fn else "EVALSHA"
        print(f"| {t} | {way} | " + " | ".join(f"{res[c]:,.0f}" for c in CASES) + " | "
              + " | ".join(f"{res[c] / got[0][c]:.2f}" for c in CASES) + " |")


@contextlib.contextmanager
def callgrind_server(toggles: Sequence[str] = ()) -> Iterator[tuple[int, str, str]]:
    """A valkey-server under ``valgrind --tool=callgrind`` (counting only inside the
    functions ``toggles``, if any): (its pid, its URL, the folder of its counter
    dumps), answering PING; stopped and its dumps removed at exit."""
    port = pick_free_port("127.0.0.1")
    out = tempfile.mkdtemp(prefix="batchq-cg-")
    collect = ["--collect-atstart=no", *(f"--toggle-collect={t}" for t in toggles)] \
        if toggles else []
    server = subprocess.Popen(
        ["valgrind", "--tool=callgrind", *collect, f"--callgrind-out-file={out}/cg.out.%p",
         str(binary_path()), "--port", str(port), "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    r = redis.Redis.from_url(url)
    try:
        for _ in range(150):
            try:
                r.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.2)
        yield server.pid, url, out
    finally:
        r.close()
        server.terminate()
        server.wait(30)
        for f in glob.glob(os.path.join(out, "cg.out.*")):
            os.unlink(f)
        os.rmdir(out)


def on_fresh_server(tree: Path, functions: bool, n_calls: int, n_jobs: int
                    ) -> dict[str, float]:
    with callgrind_server(_TOGGLES) as (pid, url, out):
        r = redis.Redis.from_url(url)
        try:
            return measure(r, url, Counter(pid, out), tree, functions, n_calls, n_jobs)
        finally:
            r.close()

if __name__ == "__main__":
    main()
