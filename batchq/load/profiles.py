"""The words of ``batchq bench load``: rate profiles and ``--abort-on`` rules.

Profiles (``loadgen.Profile``): ``--rate R --duration D`` (constant), ``--steps
500,1000,2000 --step-s 30``, ``--ramp 0:5000 --duration 120``. A profile travels in
the run's meta as ``to_spec`` text, so ``--producers`` children and ``--join`` from
other machines send the same schedule.

Abort rules: ``p99>500ms``, ``p50>20ms``, ``p99.9>2s`` (the task's run time; prefix
``start.`` or ``done.`` for enqueue-to-start / enqueue-to-done), ``errors>1%`` (share
of the jobs done) or ``errors>100`` (a count). Rules are evaluated once a second on
the last ``WINDOW_S`` seconds of merged figures, once at least ``MIN_JOBS`` jobs were
done in that window, so a knee shows as soon as it is reached rather than diluted by
the whole run.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from .schedule import Histogram, Profile

__all__ = ["AbortRule", "describe", "from_spec", "parse_abort", "parse_ramp", "parse_steps",
           "to_spec"]

WINDOW_S = 5
MIN_JOBS = 10


def _rate(raw: str, what: str, zero_ok: bool = False) -> float:
    try:
        v = float(raw)
    except ValueError:
        raise ValueError(f"{what}: {raw!r} is not a number") from None
    if not math.isfinite(v) or v < 0 or (v == 0 and not zero_ok):
        raise ValueError(f"{what}: {raw!r} must be a {'' if zero_ok else 'positive '}"
                         "finite rate")
    return v


def parse_steps(raw: str) -> list[float]:
    """``500,1000,2000`` -> rates in jobs/s."""
    parts = [p.strip() for p in raw.split(",")]
    if not raw.strip() or any(not p for p in parts):
        raise ValueError(f"--steps: {raw!r} is not a comma-separated list of rates")
    return [_rate(p, "--steps") for p in parts]


def parse_ramp(raw: str) -> tuple[float, float]:
    """``0:5000`` -> (start rate, end rate); one of them must be positive."""
    lo, sep, hi = raw.partition(":")
    if not sep:
        raise ValueError(f"--ramp: {raw!r} is not START:END (jobs/s), e.g. 0:5000")
    a, b = _rate(lo.strip(), "--ramp", True), _rate(hi.strip(), "--ramp", True)
    if a == 0 and b == 0:
        raise ValueError(f"--ramp: {raw!r} sends nothing")
    return a, b


def describe(p: Profile) -> str:
    if len(p.segments) == 1:
        d, r0, r1 = p.segments[0]
        return f"{r0:g}/s for {d:g} s" if r0 == r1 else f"ramp {r0:g}..{r1:g}/s over {d:g} s"
    if all(r0 == r1 for _, r0, r1 in p.segments):
        return (f"steps {','.join(f'{r0:g}' for _, r0, _ in p.segments)}/s, "
                f"{p.segments[0][0]:g} s each")
    return f"{len(p.segments)} segments over {p.duration_s:g} s"


def to_spec(p: Profile) -> str:
    """A compact text form of a profile (``from_spec`` reads it back)."""
    return ";".join(f"{d!r},{r0!r},{r1!r}" for d, r0, r1 in p.segments)


def from_spec(spec: str) -> Profile:
    try:
        segs = [tuple(float(x) for x in part.split(",")) for part in spec.split(";")]
    except ValueError:
        raise ValueError(f"not a profile spec: {spec!r}") from None
    if any(len(s) != 3 for s in segs):
        raise ValueError(f"not a profile spec: {spec!r}")
    return Profile(tuple((s[0], s[1], s[2]) for s in segs))


_RULE = re.compile(r"^\s*(?:(run|start|done)\.)?(p\d+(?:\.\d+)?|max|errors)\s*>\s*"
                   r"([0-9.]+)\s*(ms|s|%)?\s*$")


@dataclass(frozen=True)
class AbortRule:
    """One ``--abort-on`` condition."""

    text: str
    figure: str
    """``run`` / ``start`` / ``done`` (a latency) or ``errors``."""
    percentile: float
    """0..100 (100: the maximum); unused for errors."""
    limit: float
    """Seconds for a latency; a fraction (``percent``) or a count for errors."""
    percent: bool = False

    def check(self, hists: dict[str, Histogram], done: int, errors: int) -> str | None:
        """Why the run should stop now (None: go on), given one window's figures."""
        if done < MIN_JOBS:
            return None
        if self.figure == "errors":
            value = errors / done if self.percent else errors
            if value > self.limit:
                shown = f"{value * 100:.2f}%" if self.percent else f"{value:,}"
                return f"{self.text}: errors were {shown} of {done:,} jobs in the last " \
                       f"{WINDOW_S} s"
            return None
        h = hists[self.figure]
        if h.count < MIN_JOBS:
            return None
        value = h.percentile_s(self.percentile)
        if value > self.limit:
            return f"{self.text}: {self.figure} time was {value * 1000:.1f} ms over the " \
                   f"last {WINDOW_S} s"
        return None


def parse_abort(raw: str) -> AbortRule:
    """``p99>500ms``, ``done.p99.9>2s``, ``max>1s``, ``errors>1%``, ``errors>100``."""
    m = _RULE.match(raw)
    if m is None:
        raise ValueError(f"--abort-on {raw!r}: expected e.g. 'p99>500ms', 'errors>1%' or "
                         "'errors>100' (latency: p<N>, max; prefix start. or done.)")
    prefix, what, number, unit = m.groups()
    try:
        limit = float(number)
    except ValueError:
        raise ValueError(f"--abort-on {raw!r}: {number!r} is not a number") from None
    if what == "errors":
        if prefix or unit in ("ms", "s"):
            raise ValueError(f"--abort-on {raw!r}: an error limit is a count or a percent")
        if unit == "%":
            if limit > 100:
                raise ValueError(f"--abort-on {raw!r}: a percent is at most 100")
            return AbortRule(raw, "errors", 0, limit / 100, percent=True)
        return AbortRule(raw, "errors", 0, limit)
    if unit not in ("ms", "s"):
        raise ValueError(f"--abort-on {raw!r}: give the latency unit, ms or s")
    pct = 100.0 if what == "max" else float(what[1:])
    if not 0 < pct <= 100:
        raise ValueError(f"--abort-on {raw!r}: a percentile is in 0..100")
    return AbortRule(raw, prefix or "run", pct, limit / 1000 if unit == "ms" else limit)
