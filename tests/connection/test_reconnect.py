"""Redis going away and coming back: workers reconnect, producers fail clearly."""

from __future__ import annotations

import signal
import time

import pytest
import redis
from apps.basic import build
from fixtures.basic import *  # noqa: F403
from helpers import free_port, wait_until

import batchq
from batchq.dev.server import EmbeddedServer

pytestmark = pytest.mark.integration


def test_worker_survives_redis_restart_and_producer_fails_clearly(namespace, queue_name,
                                                                  log_path, start_worker,
                                                                  runs):
    server = EmbeddedServer(free_port())  # our own: the session server must stay up
    server.start()
    app = build(server.url, namespace, str(log_path))
    noop = app.tasks["noop"].options(queue=queue_name)
    try:
        w = start_worker(queue_name, env={"BATCHQ_REDIS_URL": server.url})
        noop.enqueue("before")
        wait_until(lambda: runs("noop"), timeout_s=10, message=w.read_log())
        time.sleep(0.3)  # idle: blocked on its wake list

        server.stop()
        # a producer while the server is down: EnqueueError after its short retries
        t0 = time.monotonic()
        with pytest.raises(batchq.EnqueueError) as err:
            noop.enqueue("while-down")
        assert time.monotonic() - t0 < 15
        assert err.value.unknown == 1 and err.value.written == 0
        assert w.poll() is None, w.read_log()

        server.start()  # same port, empty data
        noop.enqueue("after")
        wait_until(lambda: "after" in {r.token for r in runs("noop")}, timeout_s=20,
                   message=f"job not run after the restart\n{w.read_log()}")
        assert w.poll() is None
        assert w.stop(signal.SIGTERM, timeout_s=15) == 0, w.read_log()
        assert [r.token for r in runs("noop")] == ["before", "after"]
    finally:
        app.close()
        server.stop()


def test_first_enqueue_of_a_producer_while_redis_is_down_raises_enqueue_error(namespace):
    """BUG: enqueue()/enqueue_many() call App.register_queue (a bare SADD) before the
    retrying write, so a producer that has not enqueued to the queue yet gets a raw
    redis.ConnectionError instead of batchq.EnqueueError."""
    app = batchq.App(f"redis://127.0.0.1:{free_port()}/0", namespace=namespace)

    @app.task
    async def job(x: int) -> None: ...

    try:
        with pytest.raises(batchq.EnqueueError):
            job.enqueue(1)
    except redis.ConnectionError as exc:
        raise AssertionError(f"raw {type(exc).__name__} escaped enqueue: {exc}") from exc
    finally:
        app.close()
