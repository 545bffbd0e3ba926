"""The Lua library's include files: each script is sent only the definitions it uses,
pop.lua's phases go to pop.lua alone, and pop.lua's main chunk keeps room under Lua's
200 locals a function."""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

import pytest
import redis
from fixtures.scripts import *  # noqa: F403

from batchq.store import scripts

pytestmark = pytest.mark.script

SCRIPT_DIR = Path(str(resources.files("batchq.store.scripts")))
_TOP_LOCAL = re.compile(r"(?m)^local (?:function )?([A-Za-z_]\w*(?:\s*,\s*[A-Za-z_]\w*)*)")


def _library_names(path: Path) -> set[str]:
    return {name for name, _ in scripts.definitions(path.read_text(encoding="utf-8"))[1]}


def _sent_definitions(name: str) -> list[str]:
    lib = scripts.library_for(scripts._library(), scripts.include(f"{name}.lua"))
    return [n for n, _ in scripts.definitions(lib)[1]]


def test_pop_phases_go_to_pop_alone():
    phases: set[str] = set()
    for path in SCRIPT_DIR.glob("_pop_*.lua"):
        phases |= _library_names(path)
    assert {"promote_due", "reap_leases", "pop_groups", "screen", "KEYS"} - phases == {"KEYS"}
    for name in scripts.NAMES:
        sent = set(_sent_definitions(name))
        if name == "pop":
            assert phases <= sent
        else:
            assert not sent & phases, (name, sorted(sent & phases))


def test_a_script_gets_only_what_it_names():
    # a script that names no library definition gets only the time helper it calls
    sent = set(_sent_definitions("lock_release"))
    assert sent <= {"now_ms"}, sent
    assert {"now_ms", "header", "parse"} <= set(_sent_definitions("enqueue"))


def test_pop_main_chunk_keeps_room_for_more_phases():
    src = scripts.source("pop")
    n = sum(len(m.split(",")) for m in _TOP_LOCAL.findall(src))
    # Lua allows 200 active locals a function; leave room for the phases to come
    assert n <= 150, n


def test_pop_compiles_with_its_full_library(redis_client: redis.Redis):
    src = scripts.source("pop")
    assert redis_client.script_load(src)
