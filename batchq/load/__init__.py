"""Load testing with the fleet (``batchq bench load``): the run's figures and reports.

* ``probe``: the worker's side: load jobs timed and recorded, ``current_job()``;
* ``merge``: one process's share of a run and the merged run read back from Redis;
* ``driver``: the producer side: the run opened or joined, jobs sent on the rate
  profile, the live figures watched for ``--abort-on``;
* ``report``: the report as JSON, a table, HTML or PNG.

The open-loop schedule and the histogram are ``batchq.load.schedule`` (standard library only).
"""

from __future__ import annotations

from .probe import CurrentJob, current_job

__all__ = ["CurrentJob", "current_job"]
