"""Importing the user's app from a ``MODULE:APP`` reference.

The CLI loads the app before it starts anything; the supervisor loads it afresh in a
child on SIGHUP (a rolling restart). Both use this module, so the supervisor never
imports the CLI.
"""

from __future__ import annotations

import importlib
import os
import sys

from .app import App


class AppImportError(Exception):
    """``MODULE:APP`` could not be imported or is not an ``App``."""


def load_app(ref: str) -> App:
    """Import ``module:attribute`` (attribute defaults to ``app``) and return the App."""
    module_name, _, attr = ref.partition(":")
    attr = attr or "app"
    if not module_name:
        raise AppImportError(f"{ref!r} names no module: expected MODULE:APP")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise AppImportError(f"cannot import {module_name!r}: {type(exc).__name__}: {exc}") \
            from exc
    obj = getattr(module, attr, None)
    if not isinstance(obj, App):
        raise AppImportError(f"{ref!r} is not a batchq.App (found {type(obj).__name__})")
    return obj
