"""batchq.App: task registration, validation, options(), repr, queues().

Everything here runs without Redis (the options on a real enqueue: test_app_redis.py).
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from urllib.parse import urlsplit

import pytest

from batchq import App, Task, TaskCall
from batchq.produce.producer import EnqueueOptions
from batchq.store import codec

pytestmark = pytest.mark.unit

NOWHERE = "redis://127.0.0.1:1/0"  # never connected to: App is lazy


@pytest.fixture
def app() -> App:
    return App(NOWHERE, namespace="unit")


# --- registration ----------------------------------------------------------------------


def test_bare_decorator_registers_with_defaults(app):
    @app.task
    def send(x: int) -> int:
        """Double it."""
        return x * 2

    assert isinstance(send, Task)
    assert app.tasks == {"send": send}
    c = send.config
    assert (c.name, c.queue, c.priority, c.max_attempts, c.timeout_s, c.batch_size) == (
        "send", "default", 0, 3, None, None)
    assert (c.retry_backoff_s, c.retry_backoff_max_s) == (1.0, 300.0)
    assert send.name == "send"
    assert send.queue == "default"
    assert not send.is_async
    assert not send.is_batch


def test_decorator_with_options(app):
    @app.task(name="mail.send", queue="emails", priority=7, max_attempts=5, timeout_s=2.5,
              retry_backoff_s=0.5, retry_backoff_max_s=10.0)
    def send(to: str) -> str:
        return to

    assert app.tasks == {"mail.send": send}
    c = send.config
    assert (c.name, c.queue, c.priority, c.max_attempts, c.timeout_s) == (
        "mail.send", "emails", 7, 5, 2.5)
    assert (c.retry_backoff_s, c.retry_backoff_max_s) == (0.5, 10.0)
    assert send.name == "mail.send"
    assert send.__name__ == "send"


def test_task_stays_callable_and_keeps_its_identity(app):
    def add(a: int, b: int = 1) -> int:
        """Add two numbers."""
        return a + b

    t = app.task(add)
    assert t(2) == 3
    assert t(2, b=5) == 7
    assert t.__name__ == "add"
    assert t.__doc__ == "Add two numbers."
    assert t.__wrapped__ is add
    assert t.fn is add
    assert repr(t) == "<Task add queue=default>"


def test_async_task_is_detected_and_callable(app):
    @app.task(queue="io")
    async def fetch(x: int) -> int:
        await asyncio.sleep(0)
        return x + 1

    assert fetch.is_async
    assert asyncio.run(fetch(1)) == 2


def test_batch_task(app):
    @app.task(batch_size=50)
    def many(jobs: list[codec.Job]) -> None:
        return None

    assert many.is_batch
    assert many.config.batch_size == 50


def test_duplicate_names_are_rejected(app):
    @app.task
    def job() -> str:
        return "first"

    with pytest.raises(ValueError, match="already registered"):
        @app.task
        def job() -> str:
            return "second"

    def other() -> None: ...

    with pytest.raises(ValueError, match="already registered"):
        app.task(name="job")(other)
    assert app.tasks["job"]() == "first"
    assert list(app.tasks) == ["job"]


@pytest.mark.parametrize("options", [
    {"priority": -1},
    {"priority": 10},
    {"max_attempts": 0},
    {"max_attempts": -3},
    {"batch_size": 0},
    {"batch_size": 1001},
    {"timeout_s": 0},
    {"timeout_s": -1.0},
    {"name": "bad:name"},
    {"queue": "bad:queue"},
    {"queue": "bad{queue}"},
    {"queue": ""},
])
def test_invalid_options_are_rejected_and_nothing_is_registered(app, options):
    def f() -> None: ...

    with pytest.raises(ValueError):
        app.task(**options)(f)
    assert app.tasks == {}


def test_batch_size_bounds_are_inclusive(app):
    assert app.task(batch_size=1, name="one")(lambda jobs: None).config.batch_size == 1
    assert app.task(batch_size=1000, name="max")(lambda jobs: None).config.batch_size == 1000


@pytest.mark.parametrize("namespace", ["", "a:b", "a{b", "a b"])
def test_invalid_namespace_is_rejected(namespace):
    with pytest.raises(ValueError, match="invalid namespace"):
        App(NOWHERE, namespace=namespace)


def test_queues_in_registration_order_without_duplicates(app):
    assert app.queues() == []
    app.task(name="a", queue="emails")(lambda: None)
    app.task(name="b")(lambda: None)
    app.task(name="c", queue="emails")(lambda: None)
    app.task(name="d", queue="sms")(lambda: None)
    assert app.queues() == ["emails", "default", "sms"]


# --- options() -------------------------------------------------------------------------


@pytest.fixture
def task(app: App) -> Task:
    @app.task(queue="q1", priority=2, max_attempts=4)
    def work(x: int) -> int:
        return x

    return work


def test_options_returns_a_view_and_leaves_the_task_alone(task):
    view = task.options(priority=9)
    assert isinstance(view, TaskCall)
    assert view._opts == EnqueueOptions(priority=9)
    assert task._opts == EnqueueOptions()
    assert task.config.priority == 2


def test_options_merge_later_wins_and_unset_fields_are_kept(task):
    view = task.options(queue="q2", priority=3).options(priority=8, max_attempts=9)
    assert view._opts == EnqueueOptions(queue="q2", priority=8, max_attempts=9)


def test_delay_then_eta_keeps_only_eta(task):
    view = task.options(delay_s=30).options(eta=1_900_000_000.0)
    assert view._opts.eta == 1_900_000_000.0
    assert view._opts.delay_s is None


def test_eta_then_delay_keeps_only_delay(task):
    when = datetime(2030, 1, 1, tzinfo=UTC)
    view = task.options(eta=when).options(delay_s=5)
    assert view._opts.delay_s == 5
    assert view._opts.eta is None


def test_delay_and_eta_together_are_rejected(task):
    with pytest.raises(ValueError, match="not both"):
        task.options(delay_s=1, eta=1_900_000_000.0)


@pytest.mark.parametrize("options", [{"priority": 10}, {"priority": -1}, {"max_attempts": 0},
                                     {"delay_s": -0.5}])
def test_invalid_enqueue_options_are_rejected(task, options):
    with pytest.raises(ValueError):
        task.options(**options)


def test_options_resolve_against_the_task_defaults(task):
    p = task._plan()
    assert (p.keys.queue, p.head, p.due, p.task) == ("q1", codec.header(2, 4), None, "work")
    p = task.options(queue="q2", priority=7, max_attempts=1, delay_s=1.5)._plan()
    assert (p.keys.queue, p.head, p.due) == ("q2", b"7:0:1:", ("rel", 1500))
    p = task.options(eta=datetime(2030, 1, 1, tzinfo=UTC))._plan()
    assert p.due == ("abs", 1_893_456_000_000)
    p = task.options(delay_s=0)._plan()
    assert p.due is None  # no delay: straight to ready


def test_a_plan_is_built_once_per_target_and_follows_what_it_depends_on(app):
    @app.task(queue="hot", shards=3)
    def spread() -> None: ...

    @app.task(queue="plain")
    def one() -> None: ...

    # built once, then reused by every call (it is rebuilt per call no more)
    assert one._plan() is one._plan()
    assert one._plan(keyed=True) is not one._plan()
    view = one.options(priority=5)
    assert view._plan() is view._plan() and view._plan().head.startswith(b"5:")
    # a sharded queue: one plan per shard, still in turn
    queues = [spread._plan().keys.queue for _ in range(6)]
    assert sorted(queues[:3]) == ["hot", "hot:s1", "hot:s2"] and queues[3:] == queues[:3]
    # the payload limit is read anew: a plan cached before a change does not hide it
    before = one._plan()
    app.max_payload_bytes = 10
    assert one._plan() is not before and one._plan().max_payload == 10


# --- repr ------------------------------------------------------------------------------


@pytest.mark.parametrize(("url", "shown"), [
    ("redis://user:secret@host:6379/0", "redis://user:***@host:6379/0"),
    ("redis://:secret@host:6379/0", "redis://:***@host:6379/0"),
    ("rediss://user:secret@cache.example.com:6380/2", "rediss://user:***@cache.example.com:6380/2"),
    ("redis://host:6379/0", "redis://host:6379/0"),
])
def test_app_repr_hides_the_password(url, shown):
    app = App(url, namespace="ns")
    assert repr(app) == f"App(redis_url={shown!r}, namespace='ns')"
    assert "secret" not in repr(app)
    assert "secret" not in repr(app.redis_settings)
    assert app.redis_url == url  # the real URL is still used to connect


def test_app_repr_hides_a_password_given_in_the_query_string():
    # redis-py reads ?password=... (parse_url passes it to the connection)
    app = App("redis://host:6379/0?password=secret", namespace="ns")
    assert "secret" not in repr(app)


def test_app_repr_of_an_ipv6_url_is_still_a_valid_url():
    app = App("redis://user:secret@[::1]:6379/0", namespace="ns")
    shown = repr(app).split("'")[1]
    assert "secret" not in shown
    parts = urlsplit(shown)
    assert (parts.hostname, parts.port) == ("::1", 6379)




@pytest.mark.parametrize("url", ["http://h:1/0", "redis://h:99999/0", "redis://h:1/x",
                                 "localhost:6379", "redis://:pw@h:abc/0", "redis://",
                                 "redis+cluster://h:1/3", "redis://h:1/0?db=x"])
def test_malformed_redis_url_is_a_clear_error_at_once(url):
    with pytest.raises(ValueError, match="invalid Redis URL") as err:
        App(url)
    assert "pw" not in str(err.value)  # the password stays redacted


def test_bad_app_settings_name_themselves():
    for kw, named in [({"max_payload_bytes": 0}, "max_payload_bytes"),
                      ({"max_payload_bytes": 1.5}, "max_payload_bytes"),
                      ({"namespace": 5}, "namespace")]:
        with pytest.raises(ValueError, match=named):
            App(NOWHERE, **kw)
