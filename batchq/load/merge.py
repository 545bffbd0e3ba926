"""A load run's figures in Redis: what one process adds (``Share``), and the merged run
read back (``RunData``).

Every producer and worker keeps its share of a run locally and merges it about once a
second with one ``load_merge.lua`` call (counts add up, maxima keep the larger), so the
cost of a run is one call per process per second whatever its rate. Histograms are
``loadgen.Histogram`` buckets (at most ``MAX_US``: bounded fields), stored as fields
``<h>:<bucket>`` of the run's ``sum`` hash: ``r`` run time, ``s`` enqueue-to-start,
``d`` enqueue-to-done (both from the job's intended send time), ``l`` send lateness.
Per-second figures go to the ``timeline`` hash as ``<unix second>:<figure>``: ``s``
sent (by intended second), ``d`` done, ``e`` errors, ``r<bucket>`` run times (by the
second the run ended).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..store.scripts import calls
from .schedule import Histogram

__all__ = ["HISTS", "MAX_US", "RUN_TTL_S", "RunData", "Share", "decode_hash"]

RUN_TTL_S = 86_400
"""How long a run's keys live after its last merge (a day: the report can be re-read)."""

MAX_US = 3_600_000_000
"""Durations are clamped to an hour: the bucket index, and so a run's fields, are bounded."""

MAX_ERROR_TYPES = 64
"""Distinct error types one process reports per run; more are counted as ``other``."""

HISTS = ("r", "s", "d", "l")

SUM, TIMELINE, META = 1, 2, 3


@dataclass
class _Second:
    done: int = 0
    errors: int = 0
    sent: int = 0
    run: Histogram = field(default_factory=Histogram)


@dataclass
class Share:
    """One process's not yet merged part of a run. Not thread-safe: callers lock."""

    hists: dict[str, Histogram] = field(default_factory=lambda: {h: Histogram() for h in HISTS})
    counts: dict[str, int] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)
    examples: dict[str, str] = field(default_factory=dict)
    seconds: dict[int, _Second] = field(default_factory=dict)
    maxima: dict[str, int] = field(default_factory=dict)
    meta_set: dict[str, str] = field(default_factory=dict)
    meta_incr: dict[str, int] = field(default_factory=dict)
    error_types_seen: set[str] = field(default_factory=set)
    """Error types this process has reported for the run so far (kept across merges)."""

    def count(self, name: str, n: int = 1) -> None:
        self.counts[name] = self.counts.get(name, 0) + n

    def second(self, unix_s: float) -> _Second:
        sec = int(unix_s)
        s = self.seconds.get(sec)
        if s is None:
            s = self.seconds[sec] = _Second()
        return s

    def error(self, kind: str, message: str) -> None:
        kind = kind[:100] or "error"
        if kind not in self.error_types_seen:
            if len(self.error_types_seen) >= MAX_ERROR_TYPES:
                kind = "other"
            self.error_types_seen.add(kind)
        self.errors[kind] = self.errors.get(kind, 0) + 1
        if kind not in self.examples:
            self.examples[kind] = message[:300]

    def record_run(self, intended_s: float, start_s: float, end_s: float, run_s: float,
                   error: tuple[str, str] | None) -> None:
        """One finished load job, as its worker saw it (wall-clock seconds)."""
        h = self.hists
        h["r"].record(min(run_s, MAX_US / 1e6))
        h["s"].record(min(start_s - intended_s, MAX_US / 1e6))
        h["d"].record(min(end_s - intended_s, MAX_US / 1e6))
        sec = self.second(end_s)
        sec.done += 1
        sec.run.record(min(run_s, MAX_US / 1e6))
        self.count("done")
        if error is not None:
            sec.errors += 1
            self.count("errors")
            self.error(*error)
        end_us = round(end_s * 1e6)
        if end_us > self.maxima.get("last_done_us", 0):
            self.maxima["last_done_us"] = end_us

    def empty(self) -> bool:
        return not (self.counts or self.seconds or self.meta_set or self.meta_incr
                    or any(h.count for h in self.hists.values()))

    def ops(self) -> list[tuple[str, int, str, Any]]:
        """The ``load_merge.lua`` operations that add this share to the run."""
        out: list[tuple[str, int, str, Any]] = []
        for name, h in self.hists.items():
            if h.count:
                out += [("i", SUM, f"{name}:{i}", c) for i, c in h.counts.items()]
                out += [("m", SUM, f"{name}:max", h.max_us), ("i", SUM, f"{name}:sum", h.sum_us)]
        out += [("i", SUM, k, v) for k, v in self.counts.items()]
        out += [("m", SUM, k, v) for k, v in self.maxima.items()]
        out += [("i", SUM, f"e:{k}", v) for k, v in self.errors.items()]
        out += [("n", SUM, f"x:{k}", v) for k, v in self.examples.items()]
        for sec, s in self.seconds.items():
            for name, v in (("d", s.done), ("e", s.errors), ("s", s.sent)):
                if v:
                    out.append(("i", TIMELINE, f"{sec}:{name}", v))
            out += [("i", TIMELINE, f"{sec}:r{i}", c) for i, c in s.run.counts.items()]
        out += [("s", META, k, v) for k, v in self.meta_set.items()]
        out += [("i", META, k, v) for k, v in self.meta_incr.items()]
        return out

    def call(self, keys: Any) -> calls.Call:
        return calls.load_merge(keys, RUN_TTL_S * 1000, self.ops())

    def taken(self) -> Share:
        """A new empty share that remembers the error types reported so far."""
        return Share(error_types_seen=self.error_types_seen)


def decode_hash(raw: dict[Any, Any]) -> dict[str, str]:
    return {(k.decode() if isinstance(k, bytes) else str(k)):
            (v.decode(errors="replace") if isinstance(v, bytes) else str(v))
            for k, v in raw.items()}


def _hist(fields: dict[str, str], name: str) -> Histogram:
    prefix = f"{name}:"
    counts = {int(k[len(prefix):]): int(v) for k, v in fields.items()
              if k.startswith(prefix) and k[len(prefix):].isdigit()}
    return Histogram.from_buckets(counts, int(fields.get(f"{name}:max", 0) or 0) or None,
                                  int(fields.get(f"{name}:sum", 0) or 0))


@dataclass
class RunData:
    """A run as merged so far (``RunData.parse`` of the three hashes)."""

    meta: dict[str, str]
    fields: dict[str, str]
    hists: dict[str, Histogram]
    errors_by_type: dict[str, dict[str, Any]]
    seconds: dict[int, dict[str, Any]]

    @classmethod
    def parse(cls, meta: dict[str, str], sums: dict[str, str],
              timeline: dict[str, str] | None = None) -> RunData:
        hists = {h: _hist(sums, h) for h in HISTS}
        errors: dict[str, dict[str, Any]] = {
            k[2:]: {"count": int(v), "example": sums.get(f"x:{k[2:]}", "")}
                  for k, v in sums.items() if k.startswith("e:")}
        secs: dict[int, dict[str, Any]] = {}
        for k, v in (timeline or {}).items():
            sec_s, _, what = k.partition(":")
            if not sec_s.isdigit() or not what:
                continue
            s = secs.setdefault(int(sec_s), {"sent": 0, "done": 0, "errors": 0, "run": {}})
            if what[0] == "r" and what[1:].isdigit():
                s["run"][int(what[1:])] = int(v)
            elif what in ("s", "d", "e"):
                s[{"s": "sent", "d": "done", "e": "errors"}[what]] = int(v)
        for s in secs.values():
            s["run"] = Histogram.from_buckets(s["run"])
        ordered = sorted(errors.items(), key=lambda kv: -int(kv[1]["count"]))
        return cls(meta, sums, hists, dict(ordered), secs)

    def num(self, name: str) -> int:
        return int(self.fields.get(name, 0) or 0)

    @property
    def start_s(self) -> float:
        return float(self.meta.get("start_s", 0) or 0)

    @property
    def done(self) -> int:
        return self.num("done")

    @property
    def errors(self) -> int:
        return self.num("errors")

    @property
    def sent(self) -> int:
        return self.num("sent")

    @property
    def finished_producers(self) -> bool:
        return int(self.meta.get("finished", 0) or 0) >= int(self.meta.get("producers", 0) or 0)

    @property
    def offered_rate(self) -> float:
        return self.num("offered_mrate") / 1000

    @property
    def achieved_rate(self) -> float:
        """Jobs the fleet completed per second, from the first intended send to the last
        completion."""
        span = self.num("last_done_us") / 1e6 - self.start_s
        return self.done / span if span > 0 and self.done else 0.0


def window(now: RunData, before: RunData | None
           ) -> tuple[dict[str, Histogram], int, int]:
    """Latency histograms (``run``, ``start``, ``done``), jobs done and errors between two
    reads (``before`` None: since the start)."""
    out: dict[str, Histogram] = {}
    for name, h in (("run", "r"), ("start", "s"), ("done", "d")):
        counts = dict(now.hists[h].counts)
        if before is not None:
            for i, c in before.hists[h].counts.items():
                counts[i] = counts.get(i, 0) - c
        out[name] = Histogram.from_buckets(counts, now.hists[h].max_us or None)
    done, errors = now.done, now.errors
    if before is not None:
        done -= before.done
        errors -= before.errors
    return out, done, errors


def ms(value_s: float) -> float:
    return math.floor(value_s * 1e6) / 1e3
