"""OpenTelemetry traces of a job's way: a PRODUCER span per enqueue call, a CONSUMER
span per run, the enqueue's trace context carried in the job.

``instrument(app)`` (in the producer and in the worker's app module) puts a ``Tracing``
on ``app.clients.otel``; the producer and the worker check only that attribute, so an
app that is not instrumented pays one ``None`` check per call or job, and nothing in
batchq imports this module or ``opentelemetry`` unless the app's code does.

* Enqueue (``enqueue``, ``enqueue_many``, their asyncio twins, campaign writes): one span
  ``send {queue}`` per call; while it is open ``codec.TRACE`` holds its context, and
  every job encoded then carries it in its options map (``codec.encode_body``):
  ``"trace"`` is 25 bytes (trace id, span id, flags: W3C ``traceparent`` without its
  hex) followed by the ``tracestate`` header, if any; ``"campaign"`` the campaign id.
* Run: ``process {queue}``, a child of the producer span and linked to it; a retry or a
  redelivery runs the same entry again, so each attempt is a new span under the same
  producer span. A batch handler gets one span per batch with one link per job.
* A handler's exception is recorded on the span with status ERROR.

A stopping worker flushes the provider (``Tracing.flush``), so the spans of its last
jobs are exported even by a supervised worker process.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from importlib import metadata
from typing import TYPE_CHECKING, Any, Protocol

from ..flow.limits import group_name, group_of
from ..store import codec
from ..store.codec import Job
from ..store.keys import QueueKeys

try:
    from opentelemetry import trace
    from opentelemetry.context import Context
    from opentelemetry.trace import (
        Link,
        NonRecordingSpan,
        SpanContext,
        SpanKind,
        Status,
        StatusCode,
        TraceFlags,
        TraceState,
    )
except ImportError as exc:  # the extra is not installed: instrument() says so
    _MISSING: ImportError | None = exc
else:
    _MISSING = None

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer, TracerProvider

__all__ = ["FLUSH_S", "SYSTEM", "Tracing", "instrument", "uninstrument"]

SYSTEM = "batchq"
"""``messaging.system`` of every span."""

FLUSH_S = 5.0
"""The longest a stopping worker waits for its last spans to be exported."""

log = logging.getLogger("batchq.otel")


class _App(Protocol):
    """What ``instrument`` needs of an app (``batchq.App``)."""

    @property
    def clients(self) -> _Hooked: ...


class _Hooked(Protocol):
    otel: Tracing | None


class _Target(Protocol):
    """What a send span needs of an enqueue call (``plan.Plan``)."""

    @property
    def keys(self) -> QueueKeys: ...

    @property
    def task(self) -> str: ...

    @property
    def campaign(self) -> str | None: ...

    @property
    def group(self) -> str: ...


def instrument(app: _App, tracer_provider: TracerProvider | None = None) -> Tracing:
    """Trace ``app``'s enqueues and the jobs its workers run, with the global tracer
    provider (``opentelemetry.trace.set_tracer_provider``) or ``tracer_provider``.
    Call it where the app is built: the worker imports that module. Idempotent (a
    second call replaces the first)."""
    if not hasattr(getattr(app, "clients", None), "otel"):
        raise TypeError(f"instrument() takes a batchq.App, got {type(app).__name__} "
                        f"{app!r}")
    if _MISSING is not None:
        raise ImportError("batchq.ops.otel needs the OpenTelemetry API: pip install "
                          f"'batchq[otel]' ({_MISSING})") from _MISSING
    if codec.TRACE is None:
        codec.TRACE = ContextVar("batchq_trace", default=None)
    try:
        version = metadata.version("batchq")
    except metadata.PackageNotFoundError:
        version = ""
    tracing = Tracing(trace.get_tracer("batchq", version, tracer_provider), tracer_provider)
    app.clients.otel = tracing
    return tracing


def uninstrument(app: _App) -> None:
    """Stop tracing ``app`` (jobs enqueued from now on carry no trace context)."""
    app.clients.otel = None


class Sent:
    """The open send span of one enqueue call."""

    __slots__ = ("span",)

    def __init__(self, span: Span) -> None:
        self.span = span

    def one(self, job_id: str) -> str:
        """Record the id of the job a single enqueue wrote; returns it."""
        self.span.set_attribute("messaging.message.id", job_id)
        return job_id

    def many(self, ids: list[str]) -> list[str]:
        """Record how many jobs an ``enqueue_many`` wrote; returns their ids."""
        self.span.set_attribute("messaging.batch.message_count", len(ids))
        return ids


def _attrs(op: str, queue: str, task: str) -> dict[str, Any]:
    return {"messaging.system": SYSTEM, "messaging.operation.type": op,
            "messaging.operation.name": op, "messaging.destination.name": queue,
            "batchq.task": task}


def _carried(sc: SpanContext, campaign: str | None) -> dict[str, Any] | None:
    """The options a job carries for ``sc`` (None for an invalid context: no SDK and no
    incoming trace, so there is nothing to link to)."""
    if not sc.is_valid:
        return None
    state = sc.trace_state.to_header().encode() if sc.trace_state else b""
    out: dict[str, Any] = {"trace": sc.trace_id.to_bytes(16, "big") +
                           sc.span_id.to_bytes(8, "big") + bytes((sc.trace_flags,)) + state}
    if campaign is not None:
        out["campaign"] = campaign
    return out


def _context_of(opts: dict[str, Any] | None) -> SpanContext | None:
    """The producer span's context a job carries, None when it carries none."""
    raw = opts.get("trace") if opts is not None else None
    if type(raw) is not bytes or len(raw) < 25:
        return None
    state = None
    if len(raw) > 25:
        try:
            state = TraceState.from_header([raw[25:].decode()])
        except (UnicodeDecodeError, ValueError):
            state = None
    sc = SpanContext(int.from_bytes(raw[:16], "big"), int.from_bytes(raw[16:24], "big"),
                     is_remote=True, trace_flags=TraceFlags(raw[24]), trace_state=state)
    return sc if sc.is_valid else None


def _failed(span: Span, exc: BaseException) -> None:
    span.record_exception(exc)
    span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {_describe(exc)}"))


def _describe(exc: BaseException) -> str:
    try:
        return str(exc)
    except BaseException:
        return f"<{type(exc).__name__} whose str() failed>"


class Tracing:
    """The span hooks of one instrumented app (``app.clients.otel``)."""

    def __init__(self, tracer: Tracer, provider: TracerProvider | None = None) -> None:
        self.tracer = tracer
        self.provider = provider
        """The provider given to ``instrument``; None: the global one."""

    def flush(self, timeout_s: float = FLUSH_S) -> None:
        """Export the spans the provider still holds (a worker calls it as it stops: a
        supervised worker process ends with ``os._exit``, which runs no ``atexit``)."""
        provider = self.provider or trace.get_tracer_provider()
        flush = getattr(provider, "force_flush", None)  # the SDK's; the API's has none
        if flush is not None:
            try:
                flush(int(timeout_s * 1000))
            except Exception as exc:  # an exporter's failure must not fail the stop
                log.warning("flushing spans failed: %s", exc)

    # --- producer ----------------------------------------------------------------------

    @contextmanager
    def send(self, p: _Target) -> Iterator[Sent]:
        """The send span of one enqueue call; the jobs encoded inside carry it."""
        attrs = _attrs("send", p.keys.queue, p.task)
        if p.group:
            attrs["batchq.group"] = group_name(p.group)
        if p.campaign is not None:
            attrs["batchq.campaign"] = p.campaign
        var = codec.TRACE
        assert var is not None  # set by instrument()
        with self.tracer.start_as_current_span(f"send {p.keys.queue}", kind=SpanKind.PRODUCER,
                                               attributes=attrs) as span:
            token = var.set(_carried(span.get_span_context(), p.campaign))
            try:
                yield Sent(span)
            finally:
                var.reset(token)

    # --- worker ------------------------------------------------------------------------

    def _process(self, jobs: list[Job], single: bool) -> Span:
        """Start the process span of a job (``single``) or of a batch of jobs."""
        first = jobs[0]
        attrs = _attrs("process", first.queue, first.task)
        links = []
        parent = None
        campaigns = set()
        for j in jobs:
            opts = codec.trace_of(j.raw)
            sc = _context_of(opts)
            if opts is not None:
                campaigns.add(opts.get("campaign"))
            if sc is not None:
                links.append(Link(sc) if single else Link(sc, {
                    "messaging.message.id": j.id, "batchq.attempt": j.attempt}))
                parent = sc
        groups = {group_of(j.id) for j in jobs}
        if len(groups) == 1 and (g := groups.pop()):
            attrs["batchq.group"] = group_name(g)
        if len(campaigns) == 1 and type(c := campaigns.pop()) is str:
            attrs["batchq.campaign"] = c
        if single:
            attrs["messaging.message.id"] = first.id
            attrs["batchq.attempt"] = first.attempt
        else:
            attrs["messaging.batch.message_count"] = len(jobs)
        # one message: its producer span is the parent too; a batch (many parents) and a
        # job without a context are roots, never children of what the runner had current
        ctx = trace.set_span_in_context(NonRecordingSpan(parent)) \
            if single and parent is not None else Context()
        return self.tracer.start_span(f"process {first.queue}", context=ctx,
                                      kind=SpanKind.CONSUMER, attributes=attrs, links=links)

    def wrap(self, job: Job, fn: Callable[..., Any], is_async: bool) -> Callable[..., Any]:
        """``fn`` (a handler) run inside the process span of ``job``."""
        return self._wrap([job], fn, is_async, True)

    def wrap_batch(self, jobs: list[Job], fn: Callable[..., Any], is_async: bool
                   ) -> Callable[..., Any]:
        """``fn`` (a batch handler) run inside one process span linked to every job."""
        return self._wrap(jobs, fn, is_async, False)

    def _wrap(self, jobs: list[Job], fn: Callable[..., Any], is_async: bool, single: bool
              ) -> Callable[..., Any]:
        if is_async:
            async def traced_async(*args: Any, **kwargs: Any) -> Any:
                span = self._process(jobs, single)
                with trace.use_span(span, end_on_exit=True, record_exception=False,
                                    set_status_on_exception=False):
                    try:
                        coro: Awaitable[Any] = fn(*args, **kwargs)
                        return await coro
                    except BaseException as exc:
                        _failed(span, exc)
                        raise
            return traced_async

        def traced(*args: Any, **kwargs: Any) -> Any:
            span = self._process(jobs, single)
            with trace.use_span(span, end_on_exit=True, record_exception=False,
                                set_status_on_exception=False):
                try:
                    return fn(*args, **kwargs)
                except BaseException as exc:
                    _failed(span, exc)
                    raise
        return traced
