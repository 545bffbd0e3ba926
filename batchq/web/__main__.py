"""``python -m batchq.web [MODULE:APP] [flags]`` is ``batchq web`` (``batchq.cli.web``):
the same flags, checks and exit codes."""

from ..cli import main

raise SystemExit(main(command="web"))
