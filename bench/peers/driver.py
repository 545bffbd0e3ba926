"""The producer side of a peer, run in the peer's venv by the harness.

``python -m bench.peers.driver PEER enqueue N [TASK]``
                                                  enqueue N jobs of TASK (``noop``, the
                                                  default, or ``io``)
``python -m bench.peers.driver PEER warm``        enqueue one latency job
``python -m bench.peers.driver PEER load RATE DURATION``
                                                  open-loop latency jobs; prints the
                                                  send report (JSON) on stdout

The open-loop engine is batchq's own (``batchq/load/schedule.py``), loaded by path: it needs
only the standard library, and the peer's venv has no batchq.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
import time
from pathlib import Path
from types import ModuleType

LOADGEN = Path(__file__).resolve().parents[2] / "batchq" / "load" / "schedule.py"


def load_loadgen() -> ModuleType:
    spec = importlib.util.spec_from_file_location("batchq_loadgen", LOADGEN)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look the module up by name
    spec.loader.exec_module(mod)
    return mod


def main(argv: list[str]) -> int:
    peer, action, *rest = argv
    app = importlib.import_module(f"bench.peers.{peer}_app")
    if action == "enqueue":
        n = int(rest[0])
        t0 = time.perf_counter()
        app.enqueue_noop(n, *rest[1:2])
        print(json.dumps({"enqueued": n, "enqueue_s": time.perf_counter() - t0}))
    elif action == "warm":
        app.enqueue_lat(time.time(), time.time())
    elif action == "load":
        state = app.run_load(load_loadgen(), float(rest[0]), float(rest[1]))
        print(json.dumps(state.as_dict()))
    else:
        print(f"unknown action {action!r}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
