"""Operator commands of the ``batchq`` CLI: info, dead, enqueue, pause, resume, check."""

from __future__ import annotations

from typing import Any


def add_commands(sub: Any) -> None:
    """Add the operator subcommands; each sets ``handler`` (args -> exit code)."""
