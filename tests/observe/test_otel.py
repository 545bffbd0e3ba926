"""OpenTelemetry traces across processes: the producer here (the SDK's in-memory
exporter), real ``batchq worker apps.otel_app:app --burst`` processes exporting their
spans as JSON lines to a file (``apps.otel_app.FileExporter``)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
import redis
from apps.otel_app import BATCH_QUEUE, QUEUE, build
from fixtures.basic import *  # noqa: F403
from fixtures.runs import wait_exit
from helpers import drop_namespace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from workers import WorkerProcs, worker_env

import batchq
from batchq.ops.otel import uninstrument
from batchq.store import codec

pytestmark = pytest.mark.integration

APP_REF = "apps.otel_app:app"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def spans_path(tmp_path: Path) -> Path:
    return tmp_path / "spans.jsonl"


@pytest.fixture
def app(redis_url: str, namespace: str, exporter: InMemorySpanExporter,
        redis_client: redis.Redis) -> Iterator[batchq.App]:
    """The producer: traced, its spans kept in memory."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    a = build(redis_url, namespace, provider=provider)
    yield a
    a.close()
    drop_namespace(redis_client, namespace)


@pytest.fixture
def run_workers(redis_url: str, namespace: str, spans_path: Path, tmp_path: Path
                ) -> Iterator[Any]:
    """``run_workers(queue)``: one burst worker of the traced app until its queue is
    empty; returns the spans it exported (parsed JSON lines)."""
    env = worker_env({"BATCHQ_REDIS_URL": redis_url, "BATCHQ_TEST_NS": namespace,
                      "BATCHQ_TEST_SPANS": str(spans_path),
                      "BATCHQ_TEST_MARKS": str(tmp_path)})
    with WorkerProcs(APP_REF, env) as procs:

        def run(queue: str = QUEUE, *args: str, env: dict[str, str] | None = None
                ) -> list[dict[str, Any]]:
            proc = procs.start("-q", queue, "--burst", *args, serving=0, env=env)
            assert wait_exit(proc, 60) == 0, proc.read_log()
            return [json.loads(line) for line in spans_path.read_text().splitlines()]

        yield run


def hex_trace(span: ReadableSpan) -> str:
    assert span.context is not None
    return f"0x{span.context.trace_id:032x}"


def hex_span(span: ReadableSpan) -> str:
    assert span.context is not None
    return f"0x{span.context.span_id:016x}"


def consumers(spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [s for s in spans if s["kind"] == "SpanKind.CONSUMER"]


def entries(r: redis.Redis, app: batchq.App, queue: str) -> list[bytes]:
    return [e for k in app.keys(queue).ready for e in r.lrange(k, 0, -1)]


def test_the_consumer_span_is_a_child_of_the_producer_span(
        app: batchq.App, exporter: InMemorySpanExporter, run_workers: Any):
    jid = app.tasks["ok"].enqueue(1)
    sid = app.tasks["sync_ok"].options(group="acme").enqueue(2)
    sent = exporter.get_finished_spans()
    assert [s.name for s in sent] == [f"send {QUEUE}", f"send {QUEUE}"]
    by_id = {s.attributes["messaging.message.id"]: s for s in sent if s.attributes}
    producer = by_id[jid]
    assert producer.kind.name == "PRODUCER"
    assert producer.attributes is not None
    assert producer.attributes["messaging.system"] == "batchq"
    assert producer.attributes["messaging.destination.name"] == QUEUE
    assert producer.attributes["batchq.task"] == "ok"
    assert by_id[sid].attributes["batchq.group"] == "acme"  # type: ignore[index]

    got = {s["attributes"]["messaging.message.id"]: s for s in consumers(run_workers())}
    assert set(got) == {jid, sid}
    for job_id in (jid, sid):
        c, p = got[job_id], by_id[job_id]
        assert c["name"] == f"process {QUEUE}"
        assert c["context"]["trace_id"] == hex_trace(p)  # one trace across processes
        assert c["parent_id"] == hex_span(p)
        assert [link["context"]["span_id"] for link in c["links"]] == [hex_span(p)]
        attrs = c["attributes"]
        assert attrs["messaging.system"] == "batchq"
        assert attrs["messaging.destination.name"] == QUEUE
        assert attrs["messaging.operation.type"] == "process"
        assert attrs["batchq.attempt"] == 1
        assert c["status"]["status_code"] == "UNSET"
    assert got[jid]["attributes"]["batchq.task"] == "ok"
    assert got[sid]["attributes"]["batchq.task"] == "sync_ok"
    assert got[sid]["attributes"]["batchq.group"] == "acme"
    assert "batchq.group" not in got[jid]["attributes"]


def test_a_retry_is_a_new_span_under_the_same_producer_span(
        app: batchq.App, exporter: InMemorySpanExporter, run_workers: Any):
    jid = app.tasks["flaky"].enqueue("t1")
    (producer,) = exporter.get_finished_spans()
    runs = sorted(consumers(run_workers()), key=lambda s: s["attributes"]["batchq.attempt"])
    assert [s["attributes"]["batchq.attempt"] for s in runs] == [1, 2]
    for s in runs:
        assert s["attributes"]["messaging.message.id"] == jid
        assert s["context"]["trace_id"] == hex_trace(producer)
        assert s["parent_id"] == hex_span(producer)
        assert [link["context"]["span_id"] for link in s["links"]] == [hex_span(producer)]
    assert runs[0]["context"]["span_id"] != runs[1]["context"]["span_id"]
    assert runs[0]["status"]["status_code"] == "ERROR"
    assert runs[0]["events"][0]["attributes"]["exception.type"] == "ConnectionError"
    assert runs[1]["status"]["status_code"] == "UNSET"


def test_a_raised_exception_is_recorded_on_the_span(
        app: batchq.App, run_workers: Any):
    app.tasks["boom"].enqueue("no provider")
    (span,) = consumers(run_workers())
    assert span["status"]["status_code"] == "ERROR"
    assert span["status"]["description"] == "RuntimeError: no provider"
    (event,) = span["events"]
    assert event["name"] == "exception"
    assert event["attributes"]["exception.type"] == "RuntimeError"
    assert event["attributes"]["exception.message"] == "no provider"


def test_a_batch_handler_runs_in_one_span_linked_to_every_job(
        app: batchq.App, exporter: InMemorySpanExporter, run_workers: Any):
    with app.campaign("spring") as camp:
        ids = app.tasks["many"].options(campaign=camp).enqueue_many(range(5))
    (producer,) = exporter.get_finished_spans()
    assert producer.attributes is not None
    assert producer.attributes["messaging.batch.message_count"] == 5
    assert producer.attributes["batchq.campaign"] == "spring"
    (span,) = consumers(run_workers(BATCH_QUEUE))
    assert span["name"] == f"process {BATCH_QUEUE}"
    assert span["attributes"]["messaging.batch.message_count"] == 5
    assert span["attributes"]["batchq.campaign"] == "spring"
    assert span["parent_id"] is None  # many messages: links, no parent
    links = span["links"]
    assert sorted(link["attributes"]["messaging.message.id"] for link in links) == sorted(ids)
    assert {link["context"]["span_id"] for link in links} == {hex_span(producer)}
    assert {link["context"]["trace_id"] for link in links} == {hex_trace(producer)}


def test_a_supervised_worker_exports_its_last_spans_as_it_stops(
        app: batchq.App, run_workers: Any):
    """Spans held by a ``BatchSpanProcessor`` are flushed when the worker stops, also in
    a supervised worker process (which ends with ``os._exit``, running no ``atexit``)."""
    ids = app.tasks["ok"].enqueue_many(range(3))
    spans = run_workers(QUEUE, "-p", "1", env={"BATCHQ_TEST_SPANS_BATCHED": "1"})
    assert sorted(s["attributes"]["messaging.message.id"] for s in consumers(spans)) == \
        sorted(ids)


def test_aenqueue_and_aenqueue_many_carry_their_spans(
        app: batchq.App, exporter: InMemorySpanExporter, redis_client: redis.Redis):
    async def main() -> tuple[str, list[str]]:
        return (await app.tasks["ok"].aenqueue(1),
                await app.tasks["ok"].aenqueue_many([2, 3]))

    one, two = asyncio.run(main())
    spans = exporter.get_finished_spans()
    assert [s.attributes.get("messaging.message.id") for s in spans  # type: ignore[union-attr]
            ] == [one, None]
    assert spans[1].attributes["messaging.batch.message_count"] == 2  # type: ignore[index]
    carried = {}
    for e in entries(redis_client, app, QUEUE):
        opts = codec.trace_of(e)
        assert opts is not None
        carried[codec.decode_entry(e, QUEUE).id] = opts["trace"][16:24]
    assert carried == {one: spans[0].context.span_id.to_bytes(8, "big"),  # type: ignore[union-attr]
                       **{j: spans[1].context.span_id.to_bytes(8, "big")  # type: ignore[union-attr]
                          for j in two}}


def test_an_app_not_instrumented_writes_no_trace_bytes(
        app: batchq.App, redis_client: redis.Redis):
    traced = app.tasks["ok"].enqueue("same")
    uninstrument(app)
    plain = app.tasks["ok"].enqueue("same")
    raw = {codec.decode_entry(e, QUEUE).id: e for e in entries(redis_client, app, QUEUE)}
    body = msgpack.unpackb(raw[plain].split(b":", 4)[4])
    assert len(body) == 4  # [task, args, kwargs, enqueued_at]: as before tracing existed
    assert codec.trace_of(raw[plain]) is None
    opts = codec.trace_of(raw[traced])
    assert opts is not None and set(opts) == {"trace"} and len(opts["trace"]) == 25
    # the trace costs a few bytes: the options map {"trace": 25 bytes} (34 bytes) and
    # the due time written before it (9)
    extra = len(raw[traced]) - len(raw[plain]) - (len(traced) - len(plain))
    assert extra <= 45, extra


def test_batchq_runs_without_opentelemetry_installed(redis_url: str, namespace: str):
    """With ``opentelemetry`` unimportable: batchq imports, enqueues and runs a job in a
    worker; ``batchq.ops.otel.instrument`` says what to install."""
    code = textwrap.dedent(f"""
        import sys
        sys.modules["opentelemetry"] = None  # as if the extra were not installed
        import batchq
        app = batchq.App({redis_url!r}, namespace={namespace!r})
        ran = []

        @app.task(queue="plain")
        def f(x):
            ran.append(x)

        f.enqueue(1)
        batchq.run_worker(app, batchq.WorkerSettings(queues=("plain",), burst=True))
        assert ran == [1], ran
        import batchq.ops.otel
        try:
            batchq.ops.otel.instrument(app)
        except ImportError as exc:
            print("refused:", exc)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "refused: batchq.ops.otel needs the OpenTelemetry API: pip install " \
           "'batchq[otel]'" in out.stdout


def test_the_trace_joins_the_jobs_other_options_and_keeps_its_tracestate(
        app: batchq.App, exporter: InMemorySpanExporter, redis_client: redis.Redis):
    """A span current around the enqueue (a web request's) is the send span's parent,
    its ``tracestate`` travels with the job, and per-job options stay as they were."""
    from opentelemetry import trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

    from batchq.ops.otel import _context_of

    incoming = SpanContext(0x1234, 0x5678, is_remote=True, trace_flags=TraceFlags(1),
                           trace_state=TraceState([("vendor", "abc")]))
    with trace.use_span(NonRecordingSpan(incoming)):
        jid = app.tasks["ok"].options(timeout_s=5).enqueue(1)
    (sent,) = exporter.get_finished_spans()
    assert sent.parent is not None and sent.parent.span_id == 0x5678
    (raw,) = entries(redis_client, app, QUEUE)
    job = codec.decode_entry(raw, QUEUE)
    assert job.id == jid and job.timeout_s == 5
    carried = _context_of(codec.trace_of(raw))
    assert carried is not None and sent.context is not None
    assert (carried.trace_id, carried.span_id) == (0x1234, sent.context.span_id)
    assert carried.trace_state == TraceState([("vendor", "abc")])


def test_instrument_refuses_what_is_not_an_app():
    from batchq.ops.otel import instrument

    with pytest.raises(TypeError, match=r"instrument\(\) takes a batchq.App, got str 'app'"):
        instrument("app")  # type: ignore[arg-type]
