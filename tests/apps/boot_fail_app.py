"""An app whose worker processes exit with code 1 the moment they are forked, as a worker
does that crashes at start (a setting its runtime refuses, a broken extension): the
supervisor must stop on its first start instead of replacing them forever.

The module itself imports fine, so the supervisor starts; ``os.register_at_fork`` ends
every child it forks before it can write its first heartbeat.
"""

from __future__ import annotations

import os

import batchq

app = batchq.App(os.environ.get("BATCHQ_REDIS_URL"),
                 namespace=os.environ.get("BATCHQ_NAMESPACE", "batchq"))


@app.task
def noop() -> None:
    pass


os.register_at_fork(after_in_child=lambda: os._exit(1))
