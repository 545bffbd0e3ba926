"""Helpers shared by the integration tests (importable as ``integration._support``)."""

from __future__ import annotations

import signal
from dataclasses import dataclass
from pathlib import Path

import msgpack
import redis
from helpers import CliProcess

import batchq
from batchq.keys import QueueKeys


@dataclass(frozen=True)
class Run:
    """One line of the handlers' log."""

    kind: str
    token: str
    pid: int
    attempt: int | None
    t: float
    thread: str


def read_runs(path: Path) -> list[Run]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        kind, token, pid, attempt, t, thread = line.split(" ", 5)
        out.append(Run(kind, token, int(pid), None if attempt == "-" else int(attempt),
                       float(t), thread))
    return out



def wait_exit(proc: CliProcess, timeout_s: float) -> int:
    """Wait for a worker to exit on its own; on timeout kill it and fail with its log."""
    try:
        return proc.wait(timeout=timeout_s)
    except Exception:
        proc.stop(signal.SIGKILL, timeout_s=5)
        raise AssertionError(f"worker did not exit within {timeout_s}s\n{proc.read_log()}"
                             ) from None


def pending_keys(r: redis.Redis, app: batchq.App, queue: str) -> dict[str, int]:
    """Sizes of the keys that hold unfinished work of a queue (all zero when done)."""
    k = app.keys(queue)
    out = {"ready": sum(int(r.llen(x)) for x in k.ready), "delayed": int(r.zcard(k.delayed)),
           "reserved": int(r.zcard(k.reserved)) + int(r.zcard(k.bundles)),
           "inflight": int(r.hlen(k.inflight))}
    return out


def server_time_s(r: redis.Redis) -> float:
    sec, usec = r.time()
    return int(sec) + int(usec) / 1e6


def running(r: redis.Redis, k: QueueKeys) -> dict[str, int]:
    """Job id -> attempt of every job leased: a lease "<id>:<attempt>" in the reserved
    zset is one job; a bundle (``_lib.lua`` "Bundles") in the bundles zset holds its jobs
    whose mask byte is "0", their entries stored as popped (the run is attempt + 1)."""
    out: dict[str, int] = {}
    for m in r.zrange(k.reserved, 0, -1):
        jid, attempt = m.decode().rsplit(":", 1)
        out[jid] = int(attempt)
    for m in r.zrange(k.bundles, 0, -1):
        packed, mask = r.hmget(k.inflight, [m, m + b"~"])
        for e, bit in zip(msgpack.unpackb(packed, raw=True), mask, strict=True):
            if bit == ord("0"):
                _, a, _, jid, _ = e.split(b":", 4)
                out[jid.decode()] = int(a) + 1
    return out
