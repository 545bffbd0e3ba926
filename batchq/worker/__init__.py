"""One worker process, as stages over one shared state object.

A job meets them in this order:

* ``state.py``    the shared state, the settings (``WorkerSettings``), the buffers;
* ``fetch.py``    pop (``pop.lua``), accept into the process, the burst end;
* ``wake.py``     the idle wait on wake tokens and handed-off jobs, hand-off withdrawal;
* ``run.py``      runners, the sync pool, batch grouping, timeouts, hostile handlers,
                  recovered jobs run alone;
* ``outcomes.py`` settle into buffers, flush acks / retries / dead letters with retry;
* ``leases.py``   extend what the process holds, give back what it will not run;
* ``registry.py`` publish this worker in the registry, and read it (``live_workers``);
* ``worker.py``   ``Worker`` composes the stages and owns the stop order; ``run_worker``.

No stage imports ``worker.py``.
"""

from .registry import live_workers
from .run import JobFailed
from .state import Counters, WorkerSettings, backoff_s
from .worker import Worker, run_worker

__all__ = ["Counters", "JobFailed", "Worker", "WorkerSettings", "backoff_s", "live_workers",
           "run_worker"]
