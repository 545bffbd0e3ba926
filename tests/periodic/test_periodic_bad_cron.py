"""A cron schedule that never fires.

Fixed: ``@app.periodic(cron="0 0 30 2 *")`` (30 February) passed validation; croniter
then raised inside the scheduler and every process stopped scheduling every periodic
task ("this process no longer schedules"): a neighbouring ``every_s=1`` task ran once
in 8 s. Now such a schedule is refused at registration (no fire time within
``CRON_MAX_GAP_YEARS`` either way), and a schedule that fails in the scheduler anyway
(here: changed after registration) is logged and skipped while the others go on.
"""

from __future__ import annotations

import pytest
from fixtures.faults import *  # noqa: F403
from fixtures.fleet import Fleet
from fixtures.misuse import misuse  # noqa: F401 - the fixture

import batchq
from batchq.produce.periodic import schedules

pytestmark = pytest.mark.fault


@pytest.mark.parametrize("cron", ["0 0 30 2 *", "0 0 31 4 *", "0 0 31 2,4,6,9,11 *"])
def test_a_cron_that_never_fires_is_refused_at_registration(cron: str) -> None:
    app = batchq.App("redis://127.0.0.1:1/0", namespace="unit")  # never reached
    with pytest.raises(ValueError, match=r"never fires"):
        @app.periodic(cron=cron)
        def bad() -> None: ...
    assert "bad" not in app.tasks and schedules(app) == []


def test_rare_but_real_dates_are_accepted() -> None:
    app = batchq.App("redis://127.0.0.1:1/0", namespace="unit")

    @app.periodic(cron="0 0 29 2 *")  # every 4 (sometimes 8) years
    def leap() -> None: ...

    @app.periodic(cron="0 0 31 12 *", tz="Pacific/Kiritimati")
    def new_year() -> None: ...

    assert [s.name for s in schedules(app)] == ["leap", "new_year"]


def test_a_failing_schedule_never_stops_the_others(misuse: Fleet) -> None:  # noqa: F811
    proc = misuse.start("-q", "periodic", "-c", "2", env={"MISUSE_PERIODIC": "1"},
                        wait_ready=True)
    # every_s=1: before, it ran once (if at all) and then never again
    misuse.until(lambda: sum(r.token == "tick" and r.completed for r in misuse.runs()) >= 4,
                 20, "four ticks")
    log = proc.read_log()
    assert "periodic feb30 (cron 0 0 30 2 * (UTC)): skipped, its schedule failed" in log
    assert log.count("its schedule failed") == 1  # at most once a minute
    assert "no longer schedules" not in log
    assert proc.poll() is None
    assert not [r for r in misuse.runs() if r.token == "feb30"]
