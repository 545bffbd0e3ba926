"""Other Redis job queues, run side by side with batchq on the same Redis.

Each peer has its own virtualenv under ``bench/.peers-venv/<peer>`` (created by
``python -m bench peers --setup``: pip installs from PyPI; none of this is a batchq
dependency, and separate venvs keep their pins, e.g. arq's redis<6, apart). The peer's
app (``bench/peers/<peer>_app.py``) and the producer driver (``bench/peers/driver.py``)
run in that venv with the repository on ``PYTHONPATH``; this module only describes how
to install and start them, so it imports nothing from the peers.

Worker configurations are each project's documented choice for short I/O-free tasks on
a 2-core machine (``processes`` = the cores); ``Peer.config`` says what and why, and
bench/README.md repeats it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

PEERS_DIR = Path(__file__).resolve().parent
VENV_ROOT = PEERS_DIR.parent / ".peers-venv"


@dataclass(frozen=True)
class Peer:
    name: str
    packages: tuple[str, ...]
    """pip requirements (redis-py and hiredis are added for the recorder)."""
    dist: str
    """The distribution whose version the record shows."""
    config: str
    """The worker configuration in words (for the record and the README)."""
    _argv: Callable[[Path, int, str], list[str]]

    @property
    def venv(self) -> Path:
        return VENV_ROOT / self.name

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def module(self) -> str:
        return f"bench.peers.{self.name}_app"

    def worker_argv(self, processes: int, redis_url: str) -> list[str]:
        """The command that starts this peer's worker fleet."""
        return self._argv(self.venv / "bin", processes, redis_url)

    def driver_argv(self, *args: str) -> list[str]:
        """``python -m bench.peers.driver <peer> ...`` in the peer's venv."""
        return [str(self.python), "-m", "bench.peers.driver", self.name, *args]


def _multi(bin_dir: Path, n: int, argv: list[str]) -> list[str]:
    """``n`` copies of a single-process worker under ``bench.peers.multi``."""
    return [str(bin_dir / "python"), "-m", "bench.peers.multi", str(n), "--", *argv]


PEERS: dict[str, Peer] = {p.name: p for p in (
    Peer("celery", ("celery[redis]",), "celery",
         "prefork pool, -c <cores>, --prefetch-multiplier 64 (Celery's optimizing guide: "
         "a high multiplier for many short tasks), results ignored, gossip/mingle/heartbeat "
         "off",
         lambda b, n, url: [str(b / "celery"), "-A", "bench.peers.celery_app", "worker",
                            "-P", "prefork", "-c", str(n), "--prefetch-multiplier", "64",
                            "-Q", "bench", "-l", "WARNING", "--without-gossip",
                            "--without-mingle", "--without-heartbeat"]),
    Peer("rq", ("rq",), "rq",
         "rq worker-pool -n <cores> with SimpleWorker (runs jobs in the worker process; "
         "the default Worker forks a work horse per job), result_ttl=0",
         lambda b, n, url: [str(b / "rq"), "worker-pool", "-n", str(n), "-w",
                            "rq.worker.SimpleWorker", "-u", url, "-l", "WARNING", "bench"]),
    Peer("arq", ("arq",), "arq",
         "<cores> arq processes (arq runs one event loop per process), max_jobs=100, "
         "poll_delay=0.01 s (default 0.5 s: arq polls), keep_result=0",
         lambda b, n, url: _multi(b, n, [str(b / "arq"), "bench.peers.arq_app.WorkerSettings"])),
    Peer("dramatiq", ("dramatiq[redis]",), "dramatiq",
         "dramatiq --processes <cores> --threads 8 (its defaults: a process per core, 8 "
         "threads), max_retries=0",
         lambda b, n, url: [str(b / "dramatiq"), "bench.peers.dramatiq_app", "--processes",
                            str(n), "--threads", "8", "--queues", "bench"]),
    Peer("saq", ("saq", "typing_extensions"), "saq",
         "saq --workers <cores>, concurrency=10 per worker (its default; 100 exhausts "
         "redis-py's asyncio connection pool: each slot holds a blocking dequeue)",
         lambda b, n, url: [str(b / "saq"), "bench.peers.saq_app.settings", "--workers",
                            str(n), "--quiet"]),
    Peer("taskiq", ("taskiq", "taskiq-redis"), "taskiq",
         "taskiq worker --workers <cores>, --max-async-tasks 100 (default), "
         "RedisStreamBroker (taskiq-redis's broker with acknowledgements)",
         lambda b, n, url: [str(b / "taskiq"), "worker", "bench.peers.taskiq_app:broker",
                            "--workers", str(n), "--max-async-tasks", "100",
                            "--log-level", "WARNING"]),
    Peer("huey", ("huey",), "huey",
         "huey_consumer -k process -w <cores> (huey: processes for CPU-bound work, and a "
         "no-op job is all queue overhead), RedisHuey blocking pop, results off",
         lambda b, n, url: [str(b / "huey_consumer"), "bench.peers.huey_app.huey", "-k",
                            "process", "-w", str(n), "-q"]),
)}


def install_argv(peer: Peer) -> list[list[str]]:
    """The commands ``--setup`` runs for one peer."""
    base = getattr(sys, "_base_executable", sys.executable)
    return [
        [base, "-m", "venv", str(peer.venv)],
        [str(peer.python), "-m", "pip", "install", "-q", "--upgrade", "pip"],
        [str(peer.python), "-m", "pip", "install", "-q", *peer.packages, "redis", "hiredis"],
    ]


@dataclass(frozen=True)
class LocalPeer(Peer):
    """A system that runs in the harness's own interpreter (no virtualenv of its own)."""

    @property
    def python(self) -> Path:
        return Path(sys.executable)


FLOOR = LocalPeer(
    "floor", ("redis",), "redis",
    "a bare RPUSH -> BLPOP: <cores> processes each waiting in BLPOP on a plain redis-py "
    "client, recording each job as its reply is read; the producer RPUSHes one value per "
    "job from a paced synchronous loop",
    lambda b, n, url: [sys.executable, "-m", "bench.peers.multi", str(n), "--",
                       sys.executable, "-m", "bench.peers.floor_app", "worker"])
"""The bare ``RPUSH`` -> ``BLPOP`` floor of the latency rotation (``bench.peers.floor_app``)."""
