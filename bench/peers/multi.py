"""``python -m bench.peers.multi N -- CMD ...``: N copies of a single-process worker.

For peers whose worker command runs one process (arq). SIGTERM / SIGINT are passed on
to every copy; exits when all have, with the first non-zero code.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from types import FrameType


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m bench.peers.multi N -- CMD ...", file=sys.stderr)
        return 2
    n, cmd = int(argv[0]), argv[2:]
    procs = [subprocess.Popen(cmd) for _ in range(n)]

    def forward(sig: int, frame: FrameType | None) -> None:
        for p in procs:
            if p.poll() is None:
                p.send_signal(sig)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    while any(p.poll() is None for p in procs):
        time.sleep(0.1)
    return next((p.returncode for p in procs if p.returncode), 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
