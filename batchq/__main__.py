"""``python -m batchq`` is the ``batchq`` command."""

from .cli import main

raise SystemExit(main())
