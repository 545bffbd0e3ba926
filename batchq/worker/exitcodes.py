"""Process exit codes of every batchq command, worker and supervisor, in one place.

The supervisor reads a child's code to decide whether to replace it; the CLI returns
these to the shell; the tests and deploy docs quote them.
"""

from __future__ import annotations

EXIT_OK = 0
"""Success. A burst worker exits 0 only when its queues are really empty."""

EXIT_ERROR = 1
"""An unexpected error (logged)."""

EXIT_USAGE = 2
"""A bad flag or value: a message, never a traceback."""

EXIT_IMPORT = 3
"""The app (``MODULE:APP``) cannot be imported, or a child cannot boot."""

EXIT_REDIS = 4
"""Redis cannot be reached or refused the check at start-up."""

EXIT_RECYCLED = 5
"""A worker that stopped at ``--max-jobs-per-child``: the supervisor replaces it, even in
burst mode (where 0 means the queues are drained)."""

EXIT_STALLED = 6
"""A burst run that cannot make progress: jobs remain but every queue that holds them is
paused (or otherwise unservable), so waiting would never end."""

EXIT_MEMORY = 7
"""A worker whose RSS passed ``--max-memory-per-child``: it finished its running jobs and
gave back its prefetched ones; the supervisor replaces it (reason ``memory``)."""
