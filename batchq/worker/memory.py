"""The memory cap of a worker process (``--max-memory-per-child``).

A handler that leaks (a cache that only grows, a C library that never frees) makes the
process grow until the kernel's OOM killer takes it with every job it holds. With a
cap, the worker looks at its resident set size once a second (one read of
``/proc/self/statm``: no cost per job) and, past the cap, stops the way a SIGTERM or
``--max-jobs-per-child`` stops it: it fetches nothing more, gives its prefetched jobs
back, lets its running jobs finish and exits ``EXIT_MEMORY``; the supervisor counts a
restart of reason ``memory`` and forks a fresh process.
"""

from __future__ import annotations

import logging
import os
import resource
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .state import State

log = logging.getLogger("batchq.worker")

CHECK_EVERY_S = 1.0
"""How often a capped worker reads its RSS."""

MIB = 1 << 20

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_bytes() -> int:
    """This process's resident set size now (Linux); elsewhere its peak, which only
    makes the cap act sooner."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024


async def watch(st: State, cap_mb: int, on_over: Callable[[float], None]) -> None:
    """Read the RSS every ``CHECK_EVERY_S`` until the worker stops; past ``cap_mb``
    MB (MiB: 1,048,576 bytes, as ``ps`` counts), call ``on_over(rss_mb)`` once and return."""
    while not st.stopping:
        await st.sleep_unless_closed(CHECK_EVERY_S)
        if st.stopping:
            return
        rss_mb = rss_bytes() / MIB
        if rss_mb > cap_mb:
            log.warning("memory cap: RSS %.0f MB passed --max-memory-per-child %d MB; "
                        "finishing the running jobs, giving back the prefetched ones, "
                        "then this process is replaced", rss_mb, cap_mb)
            on_over(rss_mb)
            return
