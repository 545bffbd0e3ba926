"""Logging setup: plain text or JSON lines, every line naming the process that wrote
it, and no password from a Redis URL ever printed."""

from __future__ import annotations

import json
import logging
import os
import re
import sys

_SECRET = re.compile(r"(\w+://[^:/@\s]*:)([^@\s]+)(@)")

_role = "main"


def redact_text(text: str) -> str:
    """``text`` with the password of any ``scheme://user:password@host`` replaced."""
    return _SECRET.sub(r"\1***\3", text)


class _Redact(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        clean = redact_text(msg)
        if clean != msg:
            record.msg, record.args = clean, None
        record.role = _role
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, pid, role, msg (and exc)."""

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "pid": record.process,
            "role": getattr(record, "role", _role),
            "msg": record.getMessage(),
        }
        if record.exc_info:
            out["exc"] = redact_text(self.formatException(record.exc_info))
        return json.dumps(out, ensure_ascii=False)


class PlainFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s [%(role)s %(process)d] %(name)s: %(message)s")

    def formatException(self, ei: object) -> str:
        return redact_text(super().formatException(ei))  # type: ignore[arg-type]


def setup_logging(level: str = "INFO", fmt: str = "plain", role: str = "main") -> None:
    """Configure the root logger for this process (call again after fork with a new role)."""
    global _role
    _role = role
    if fmt not in ("plain", "json"):
        raise ValueError("log format must be 'plain' or 'json'")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else PlainFormatter())
    handler.addFilter(_Redact())
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level.upper())
    os.environ.setdefault("BATCHQ_LOG_FORMAT", fmt)
