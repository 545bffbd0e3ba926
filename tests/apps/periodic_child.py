"""A process that runs nothing but the periodic scheduler of a small app, for the
periodic tests: ``python -m apps.periodic_child URL NAMESPACE QUEUE LEASE_S``.
SIGTERM stops it (it then hands the leadership over); it prints ``ready`` once running."""

from __future__ import annotations

import asyncio
import signal
import sys

import batchq


def build(url: str, namespace: str, queue: str) -> batchq.App:
    app = batchq.App(url, namespace)

    @app.periodic(every_s=1, queue=queue)
    def beat() -> None:
        """Never run here: the tests read the enqueued jobs from Redis."""

    return app


async def main(url: str, namespace: str, queue: str, lease_s: float) -> None:
    app = build(url, namespace, queue)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    print("ready", flush=True)
    await batchq.run_scheduler(app, stop, lease_s=lease_s)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])))
