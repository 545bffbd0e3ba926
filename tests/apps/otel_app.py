"""A traced batchq app for the OpenTelemetry tests (tests/observe/test_otel.py).

``build(url, namespace, spans_path)`` makes the app and instruments it with its own
tracer provider; with a ``spans_path`` every finished span is appended to that file as
one JSON line (``FileExporter``: the worker's spans, read back by the test process).
The module-level ``app`` is built from the environment (``BATCHQ_REDIS_URL``,
``BATCHQ_TEST_NS``, ``BATCHQ_TEST_SPANS``) for ``batchq worker apps.otel_app:app``.
``BATCHQ_TEST_MARKS`` is a directory where ``flaky`` remembers its first attempts;
``BATCHQ_TEST_SPANS_BATCHED=1`` exports through a ``BatchSpanProcessor``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)

import batchq
from batchq.ops.otel import instrument

QUEUE = "otel"
BATCH_QUEUE = "otel-batch"


class FileExporter(SpanExporter):
    """Each span as one JSON line (``ReadableSpan.to_json``), appended to ``path``."""

    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = "".join(s.to_json(indent=None) + "\n" for s in spans)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, lines.encode())
        finally:
            os.close(fd)
        return SpanExportResult.SUCCESS


def build(redis_url: str, namespace: str, spans_path: str | None = None,
          marks: str | None = None, provider: TracerProvider | None = None,
          batched: bool = False) -> batchq.App:
    """``batched``: spans go through a ``BatchSpanProcessor`` that exports only when
    flushed (a worker's stop), not at once."""
    app = batchq.App(redis_url, namespace=namespace)
    if provider is None:
        provider = TracerProvider()
        if spans_path:
            exporter = FileExporter(spans_path)
            provider.add_span_processor(
                BatchSpanProcessor(exporter, schedule_delay_millis=600_000) if batched
                else SimpleSpanProcessor(exporter))
    instrument(app, tracer_provider=provider)

    @app.task(queue=QUEUE)
    async def ok(x: Any) -> Any:
        return x

    @app.task(queue=QUEUE)
    def sync_ok(x: Any) -> Any:
        return x

    @app.task(queue=QUEUE, max_attempts=1)
    async def boom(message: str) -> None:
        raise RuntimeError(message)

    @app.task(queue=QUEUE, max_attempts=3, retry_backoff_s=0.05)
    async def flaky(token: str) -> None:
        # the first attempt fails (it leaves a mark), the second succeeds
        mark = Path(marks or ".") / token
        if not mark.exists():
            mark.touch()
            raise ConnectionError(f"first attempt of {token}")

    @app.task(queue=BATCH_QUEUE, batch_size=50)
    async def many(jobs: list[batchq.Job]) -> None:
        return None

    return app


app = build(os.environ.get("BATCHQ_REDIS_URL", "redis://localhost:6379/0"),
            os.environ.get("BATCHQ_TEST_NS", "batchq"),
            os.environ.get("BATCHQ_TEST_SPANS"), os.environ.get("BATCHQ_TEST_MARKS"),
            batched=bool(os.environ.get("BATCHQ_TEST_SPANS_BATCHED")))
