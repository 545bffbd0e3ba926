"""The scripts' text: each script's file with the library definitions it uses, as
sent to the server, and the same as a Redis Functions library (``function_library``).

``library_for`` sends each script only the library definitions it names; the library's
files (``LIBRARY``) keep a layout ``definitions`` can cut: top-level ``local`` lines only.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

NAMES = ("enqueue", "schedule", "pop", "ack", "nack", "release", "extend", "redrive",
         "start", "trim_dead", "lock_acquire", "lock_release", "lock_extend", "periodic_tick",
         "cancel", "ack_result", "status", "reserve",
         "load_open", "load_merge", "enqueue_tracked", "campaign_queue", "campaign_open",
         "campaign_join", "campaign_close", "campaign_finish", "enqueue_group", "hold",
         "gready_stats", "breaker_enter", "breaker_failure", "breaker_success",
         "breaker_set", "breaker_state", "reroute")

_PACKAGE = __name__.rpartition(".")[0]

REFUSED_WHEN_FULL = frozenset({
    "enqueue", "enqueue_tracked", "enqueue_group", "schedule", "periodic_tick", "reserve",
    "campaign_open", "campaign_queue", "campaign_join", "load_open", "load_merge",
    "lock_acquire", "redrive"})
"""The scripts that add work, refused whole by a server at ``maxmemory`` (noeviction).
The others run there (the function flag ``allow-oom``): a full server is drained by
workers, whose pops, acks, retries and releases must go on. A script sent by EVALSHA
instead is refused at its first write that may grow memory, unless it wrote before."""


def source(name: str) -> str:
    """The full text of one script as sent to the server: the library's definitions the
    script uses (``library_for``), then the script."""
    defs, body = _parts(name)
    return defs + "\n" + body


@cache
def _parts(name: str) -> tuple[str, str]:
    """Script ``name``'s library definitions (``library_for``) and its own text: read
    and cut once per process, for ``source`` and ``function_library`` alike."""
    if name not in NAMES:
        raise KeyError(name)
    body = resources.files(_PACKAGE).joinpath(f"{name}.lua").read_text(encoding="utf-8")
    return library_for(_library(), body), body


def function_library(name: str, fname: str) -> str:
    """Script ``name`` as a Redis Functions library (``FUNCTION LOAD``) that registers it
    as the function ``fname`` (also the library's name).

    The library's definitions run once, when the library is loaded; the script's body
    becomes the function, run on every ``FCALL``. A script sent with ``EVALSHA`` runs its
    whole text on every call instead, so every ``local function`` it carries is a closure
    made per call (pop.lua carries 81: a third of an empty pop's server time). The
    definitions read ``KEYS`` and ``ARGV`` as the script's globals; here they are the
    library's two upvalues, set by the function before the body runs. A library-level
    table keeps its contents from call to call: the library's one table
    (``NEXT_ATTEMPT``) is a memo, which only gains."""
    defs, body = _parts(name)
    flags = "" if name in REFUSED_WHEN_FULL else "'allow-oom'"
    return (f"#!lua name={fname}\nlocal KEYS, ARGV\n{defs}\n"
            f"redis.register_function{{function_name='{fname}', flags={{{flags}}},\n"
            f"callback=function(batchq_keys, batchq_args)\n"
            f"KEYS, ARGV = batchq_keys, batchq_args\n{body}\nend}}\n")


LIBRARY = ("_lib.lua", "_entries.lua", "_dead.lua", "_writes.lua", "_leases.lua",
           "_bundles.lua", "_tracked.lua", "_waiting.lua", "_groups.lua", "_windows.lua",
           "_events.lua",
           "_pop_reap.lua", "_pop_reserve.lua", "_pop_groups.lua",
           "_pop_reply.lua", "_expiry.lua")
"""The library's files in order: a definition may use only those above it (Lua locals)."""


def include(name: str) -> str:
    """The text of one library file."""
    return resources.files(_PACKAGE).joinpath(name).read_text(encoding="utf-8")


@cache
def _library() -> str:
    """The library's definitions, file after file in ``LIBRARY`` order, under the head of
    ``_lib.lua`` (the other files' own head comments are not sent). Read once per
    process."""
    parts = []
    for i, name in enumerate(LIBRARY):
        head, defs = definitions(include(name), name)
        parts.append(head if i == 0 else "")
        parts.extend(text for _, text in defs)
    return "".join(parts)


_DEFINITION = re.compile(r"local (?:function )?([A-Za-z_]\w*)")
_WORD = re.compile(r"[A-Za-z_]\w*")


def definitions(lib: str, name: str = "library") -> tuple[str, list[tuple[str, str]]]:
    """A library file ``lib`` (called ``name`` in errors) split into its head (the text
    before the first definition) and its top-level definitions in order, ``(name,
    text)``: a line ``local function NAME`` (to its ``end`` at column 0, or on one line)
    or ``local NAME = ...``, with the comment lines right above it; blank lines and
    comments after a blank line stay with the text before them. Any other top-level line
    is a ``ValueError``: the library keeps to this layout."""
    head: list[str] = []
    defs: list[tuple[str, list[str]]] = []
    above: list[str] = []  # top-level comments, for the definition below them
    in_function = False
    for line in lib.splitlines(keepends=True):
        if in_function:
            defs[-1][1].append(line)
            in_function = line.rstrip() != "end"
            continue
        m = _DEFINITION.match(line)
        if m is not None:
            defs.append((m.group(1), [*above, line]))
            above = []
            # a function runs to its "end" at column 0, unless it is all on this line
            in_function = line.startswith("local function ") and \
                not line.rstrip().endswith(" end")
        elif line.startswith("--"):
            above.append(line)
        elif not line.strip():
            (defs[-1][1] if defs else head).extend([*above, line])
            above = []
        else:
            raise ValueError(f"{name}: a top-level line that defines nothing: {line!r}")
    (defs[-1][1] if defs else head).extend(above)
    return "".join(head), [(name, "".join(text)) for name, text in defs]


def library_for(lib: str, body: str) -> str:
    """The part of ``lib`` that ``body`` needs: its head and every definition the body
    names, directly or through another kept definition, in the library's order.

    A script runs its whole text on every call, so each ``local function`` of the
    library is a closure made per call whether used or not: on Valkey 9.1 the full
    library cost a script 11 µs a call. A definition can only use those above it (Lua
    locals), so one pass from the last definition up collects them all. A name that
    only appears in a comment or a string keeps its definition: harmless."""
    head, defs = _named(lib)
    needed = set(_WORD.findall(body))
    kept = []
    for name, text, names in reversed(defs):
        if name in needed:
            needed |= names
            kept.append(text)
    return head + "".join(reversed(kept))


@cache
def _named(lib: str) -> tuple[str, list[tuple[str, str, frozenset[str]]]]:
    """``definitions(lib)`` with the names each definition mentions: parsed once per
    process, not once per script (27 parses were 17 ms of a process's start)."""
    head, defs = definitions(lib)
    return head, [(name, text, frozenset(_WORD.findall(text))) for name, text in defs]
