"""The campaign gauges: jobs by campaign and state, bounded in number of campaigns."""

from __future__ import annotations

import pytest
from fixtures.campaigns import *  # noqa: F403

from batchq.produce.campaign import CAMPAIGN_SERIES, CampaignCollector

pytestmark = pytest.mark.integration


def _samples(app):  # type: ignore[no-untyped-def]
    fams = {f.name: f for f in CampaignCollector(app).collect()}
    jobs = {(s.labels["campaign"], s.labels["state"]): s.value
            for s in fams["batchq_campaign_jobs"].samples}
    done = {s.labels["campaign"]: s.value for s in fams["batchq_campaign_done"].samples}
    return jobs, done


def test_jobs_by_campaign_and_state(app, drain):
    c = app.campaign("m1")
    app.tasks["send"].options(campaign=c).enqueue_many([(1,), (2,), (3, True)])
    c.seal()
    jobs, done = _samples(app)
    assert jobs[("m1", "total")] == 3 and jobs[("m1", "pending")] == 3
    assert done["m1"] == 0
    drain("a")
    jobs, done = _samples(app)
    assert (jobs[("m1", "succeeded")], jobs[("m1", "dead")], jobs[("m1", "pending")]) == \
        (2, 1, 0)
    assert done["m1"] == 1


def test_cardinality_is_bounded(app):
    for i in range(CAMPAIGN_SERIES + 10):
        app.campaign(f"many-{i}")
    jobs, done = _samples(app)
    assert len(done) == CAMPAIGN_SERIES
    assert len(jobs) == 6 * CAMPAIGN_SERIES  # total, pending, succeeded, dead, cancelled, expired
