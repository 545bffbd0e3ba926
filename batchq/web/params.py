"""What a request may carry, checked in one place: every query parameter and every
action body of the console goes through here, so a bad value is a ``400`` whose text
names the parameter and its range, never a 500 or a Redis error (a 503 that blames Redis
for an offset of ``1e20``).

* Integers are plain decimal digits (``"1e20"``, ``"1.5"``, ``" 3"`` are refused) and
  must lie in the range the route gives; nothing is clamped silently.
* An action's body is a JSON object of at most ``MAX_BODY_BYTES`` nested at most
  ``MAX_DEPTH`` deep: a body of 100,000 ``[`` is refused before it is parsed (the parser
  would recurse once per bracket).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

MAX_BODY_BYTES = 256 * 1024
"""An action's body at most: 1,000 ids of a few dozen bytes each fit many times over."""
MAX_DEPTH = 16
"""How deep an action's body may nest (the deepest real one is 2: an object of a list)."""
MAX_OFFSET = 10**9
"""The largest offset or cursor a page may ask for (far past any real store)."""
MAX_TEXT_CHARS = 1000
"""The longest text parameter (a search, a job id, a campaign id)."""

_INT = re.compile(r"-?[0-9]{1,19}")


class BadRequest(Exception):
    """A bad parameter: a 400 whose message names it."""


def parse_int(name: str, raw: str, lo: int, hi: int) -> int:
    """``raw`` as an integer in ``lo..hi``; ``BadRequest`` naming ``name`` otherwise."""
    if not _INT.fullmatch(raw):
        raise BadRequest(f"{name} must be an integer from {lo} to {hi}, not {raw[:40]!r}")
    value = int(raw)
    if value < lo:
        raise BadRequest(f"{name} must be at least {lo}, not {value}")
    if value > hi:
        raise BadRequest(f"{name} must be at most {hi}, not {value}")
    return value


def query_int(query: Mapping[str, str], name: str, default: int, lo: int, hi: int) -> int:
    """Query parameter ``name`` as an integer in ``lo..hi`` (``default`` when absent)."""
    raw = query.get(name)
    if raw is None or raw == "":
        return default
    return parse_int(name, raw, lo, hi)


def query_str(query: Mapping[str, str], name: str, *, required: bool = True,
              default: str = "") -> str:
    """Query parameter ``name`` (``required``: present and not empty), at most
    ``MAX_TEXT_CHARS`` characters."""
    value = query.get(name)
    if not value:
        if required:
            raise BadRequest(f"missing parameter {name!r}")
        return default
    if len(value) > MAX_TEXT_CHARS:
        raise BadRequest(f"{name} is too long ({len(value)} characters; at most "
                         f"{MAX_TEXT_CHARS})")
    return value


def query_seconds(query: Mapping[str, str], name: str, default: float, lo: float,
                  hi: float) -> float:
    """A page's refresh interval: a number of seconds, clamped to ``lo..hi``; anything
    that is not a finite number gives ``default`` (a page always renders)."""
    raw = query.get(name)
    try:
        value = float(raw) if raw else default
    except ValueError:
        return default
    if not math.isfinite(value):
        return default
    return min(max(value, lo), hi)


def too_deep(raw: bytes, limit: int = MAX_DEPTH) -> bool:
    """True when the JSON text ``raw`` opens more than ``limit`` arrays or objects
    inside each other (brackets inside strings do not count)."""
    depth = 0
    in_string = escaped = False
    for b in raw:
        if in_string:
            if escaped:
                escaped = False
            elif b == 0x5C:  # backslash
                escaped = True
            elif b == 0x22:  # quote
                in_string = False
        elif b == 0x22:
            in_string = True
        elif b in (0x5B, 0x7B):  # [ {
            depth += 1
            if depth > limit:
                return True
        elif b in (0x5D, 0x7D):
            depth -= 1
    return False


def json_object(raw: bytes) -> dict[str, Any]:
    """An action's body: a JSON object, not nested too deep; ``BadRequest`` otherwise."""
    if too_deep(raw):
        raise BadRequest(f"the body nests deeper than {MAX_DEPTH} levels")
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        raise BadRequest("the body must be a JSON object") from None
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    return body


def body_str(body: Mapping[str, Any], name: str) -> str:
    """Field ``name`` of an action's body: a non-empty string."""
    value = body.get(name)
    if not isinstance(value, str) or not value:
        raise BadRequest(f'missing "{name}" in the body' if value is None
                         else f'"{name}" must be a non-empty string, not {value!r}'[:200])
    if len(value) > MAX_TEXT_CHARS:
        raise BadRequest(f'"{name}" is too long ({len(value)} characters)')
    return value


def body_number(body: Mapping[str, Any], name: str, *, integer: bool = False
                ) -> float | int | None:
    """Field ``name``: absent or null (None), or a finite number (an int when
    ``integer``); the range is checked by whoever uses it (``Limit``)."""
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or (
            integer and not isinstance(value, int)):
        kind = "an integer" if integer else "a number"
        raise BadRequest(f'"{name}" must be {kind}, not {value!r}'[:200])
    if not math.isfinite(value):
        raise BadRequest(f'"{name}" must be a finite number, not {value!r}')
    return value
