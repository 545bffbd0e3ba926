"""batchq.load.schedule: the log-linear histogram and the open-loop schedule (no Redis)."""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from batchq.load.schedule import Histogram, LoadState, aopen_loop, open_loop, percentile_keys

pytestmark = pytest.mark.unit


def test_histogram_percentiles_within_a_bucket() -> None:
    rng = random.Random(7)
    values = [rng.lognormvariate(-6, 1.5) for _ in range(20_000)]  # ~2.5 ms median
    h = Histogram()
    h.record_many(values)
    exact = sorted(values)
    for p in (50.0, 90.0, 99.0, 99.9):
        true = exact[max(0, int(p / 100 * len(exact) + 0.999999) - 1)]
        got = h.percentile_s(p)
        assert true - 1e-6 <= got <= true * 1.01 + 2e-6, (p, true, got)
    assert h.max_s == round(max(values) * 1e6) / 1e6
    s = h.summary_ms()
    assert list(s) == percentile_keys()
    assert list(s.values()) == sorted(s.values())


def test_histogram_merge_and_round_trip() -> None:
    a, b = Histogram(), Histogram()
    a.record_many([0.001, 0.002, -0.5])  # negative: clock skew, counts as zero
    b.record_many([0.5, 3.0])
    a.merge(b)
    assert a.count == 5 and a.min_us == 0 and a.max_us == 3_000_000
    c = Histogram.from_dict(a.to_dict())
    assert c.to_dict() == a.to_dict()
    assert c.percentile_s(100) == 3.0 and Histogram().percentile_s(50) == 0.0


def test_open_loop_keeps_the_schedule_through_a_stall() -> None:
    calls: list[tuple[list[float], float]] = []

    def send(intended: list[float], sent_at: float) -> None:
        calls.append((intended, sent_at))
        if len(calls) == 3:
            time.sleep(0.1)  # a stalled producer: the jobs due meanwhile go out late

    st = open_loop(send, rate=200, duration_s=0.5)
    intended = [t for batch, _ in calls for t in batch]
    assert st.sent == st.total == 100 and len(intended) == 100
    assert all(abs(intended[i] - (st.start_s + i / 200)) < 1e-9 for i in range(100))
    assert any(len(batch) > 1 for batch, _ in calls)  # the backlog went out together
    assert st.lateness.max_s >= 0.09  # and its lateness was recorded, not hidden
    assert st.lateness.count == 100


def test_aopen_loop_counts_errors_and_goes_on() -> None:
    seen: list[float] = []

    async def send(intended: list[float], sent_at: float) -> None:
        if len(seen) == 5:
            seen.append(-1.0)
            raise ConnectionError("boom")
        seen.extend(intended)

    state = LoadState(rate=100, duration_s=0.2)
    st = asyncio.run(aopen_loop(send, 100, 0.2, state=state))
    assert st is state and st.finished
    assert st.errors >= 1 and st.sent + st.errors == st.total == 20
    assert st.first_error == "ConnectionError: boom"
    d = st.as_dict()
    assert d["sent"] == st.sent and d["send_lateness_ms"]["p50"] >= 0


def test_sync_and_async_shells_drive_the_same_schedule() -> None:
    """One I/O-free core (``_schedule``): with the same fake clock and the same failing
    sends, both shells send the same batches and account the same way."""

    def run(asyncio_shell: bool) -> tuple[list[int], LoadState]:
        now = [1000.0]
        batches: list[int] = []

        def clock() -> float:
            now[0] += 0.004  # every look at the clock costs 4 ms
            return now[0]

        def sync_send(intended: list[float], sent_at: float) -> None:
            batches.append(len(intended))
            if len(batches) % 3 == 0:
                raise RuntimeError("refused")

        async def async_send(intended: list[float], sent_at: float) -> None:
            sync_send(intended, sent_at)

        if asyncio_shell:
            st = asyncio.run(aopen_loop(async_send, 1_000_000, 0.0002, max_batch=50,
                                        lead_s=0.0, clock=clock))
        else:
            st = open_loop(sync_send, 1_000_000, 0.0002, max_batch=50, lead_s=0.0,
                           clock=clock)
        return batches, st

    (b1, s1), (b2, s2) = run(False), run(True)
    assert b1 == b2 and sum(b1) == 200
    assert (s1.sent, s1.errors, s1.first_error) == (s2.sent, s2.errors, s2.first_error)
    assert s1.sent + s1.errors == 200 and s1.errors > 0 and s1.finished and s2.finished
    assert s1.first_error == "RuntimeError: refused"


# --- rate profiles -----------------------------------------------------------------------


def test_profiles_place_every_job_on_the_cumulative_count() -> None:
    from batchq.load.schedule import Profile

    steps = Profile.steps([500, 1000, 2000], 30)
    assert steps.total == 105_000 and steps.boundaries_s == [30.0, 60.0]
    assert steps.time_of(15_000) == 30.0 and abs(steps.time_of(14_999) - 29.998) < 1e-9
    ramp = Profile.ramp(0, 5000, 120)
    assert ramp.total == 300_000 and ramp.time_of(0) == 0.0
    for i in (1, 10, 1000, 150_000, 299_999):
        assert abs(ramp.count_at(ramp.time_of(i)) - i) < 1e-6
    down = Profile.ramp(1000, 0, 10)  # a falling ramp takes the other root
    assert all(down.time_of(i) < down.time_of(i + 1) for i in range(0, 4999, 97))
    for bad in (lambda: Profile.steps([10, 0], 1), lambda: Profile.ramp(0, 0, 5),
                lambda: Profile.constant(0.5, 1)):
        try:
            bad()
        except ValueError:
            continue
        raise AssertionError("accepted a profile that sends nothing")


def test_parts_split_a_profile_between_producers_and_stop_ends_it() -> None:
    from batchq.load.schedule import Profile

    profile = Profile.steps([200, 400], 0.25)
    seen: list[float] = []

    async def send(intended: list[float], sent_at: float) -> None:
        seen.extend(intended)

    async def both() -> list[LoadState]:
        start = time.time() + 0.02
        return [await aopen_loop(send, 0, 0, profile=profile, part=(k, 2), start_s=start)
                for k in range(2)]

    states = asyncio.run(both())
    assert sum(s.sent for s in states) == profile.total == 150
    start = states[0].start_s
    assert sorted(seen) == [start + profile.time_of(i) for i in range(150)]

    st = LoadState(rate=1000, duration_s=10)

    async def stopper(intended: list[float], sent_at: float) -> None:
        if st.sent >= 20:
            st.stopped = True

    asyncio.run(aopen_loop(stopper, 1000, 10, state=st))
    assert 20 <= st.sent < 100


def test_abort_rules() -> None:
    from batchq.load.profiles import parse_abort

    h = Histogram()
    h.record_many([0.01] * 98 + [0.9] * 2)
    hists = {"run": h, "start": Histogram(), "done": h}
    assert parse_abort("p99>500ms").check(hists, 100, 0) is not None
    assert parse_abort("p90>500ms").check(hists, 100, 0) is None
    assert parse_abort("done.max>0.5s").check(hists, 100, 0) is not None
    assert parse_abort("errors>1%").check(hists, 100, 2) is not None
    assert parse_abort("errors>1%").check(hists, 100, 1) is None
    assert parse_abort("errors>5").check(hists, 100, 6) is not None
    assert parse_abort("errors>1%").check(hists, 5, 5) is None  # too few jobs to judge
    for bad in ("p99>5", "p99<5ms", "errors>200%", "p0>1ms", "start.errors>1"):
        try:
            parse_abort(bad)
        except ValueError as exc:
            assert repr(bad) in str(exc)
            continue
        raise AssertionError(f"accepted {bad!r}")
