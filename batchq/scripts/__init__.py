"""The Lua scripts, one atomic operation per file, loaded once per process.

Every script gets ``_lib.lua`` prepended (time from the server, the job header parser,
the dead-record writer). Calls go through redis-py's ``Script`` objects: EVALSHA first,
SCRIPT LOAD and retry on NOSCRIPT (a restarted or failed-over server), and in pipelines
the scripts are loaded before the pipeline runs.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

import redis
import redis.asyncio
from redis.commands.core import AsyncScript, Script

NAMES = ("enqueue", "schedule", "pop", "ack", "nack", "release", "extend", "redrive")


@cache
def source(name: str) -> str:
    """The full text of one script as sent to the server (library included)."""
    if name not in NAMES:
        raise KeyError(name)
    files = resources.files(__name__)
    lib = files.joinpath("_lib.lua").read_text(encoding="utf-8")
    body = files.joinpath(f"{name}.lua").read_text(encoding="utf-8")
    return lib + "\n" + body


class SyncScripts:
    """The scripts bound to a synchronous client."""

    def __init__(self, client: redis.Redis) -> None:
        self.enqueue: Script = client.register_script(source("enqueue"))
        self.schedule: Script = client.register_script(source("schedule"))
        self.pop: Script = client.register_script(source("pop"))
        self.ack: Script = client.register_script(source("ack"))
        self.nack: Script = client.register_script(source("nack"))
        self.release: Script = client.register_script(source("release"))
        self.extend: Script = client.register_script(source("extend"))
        self.redrive: Script = client.register_script(source("redrive"))


class AsyncScripts:
    """The scripts bound to an asyncio client."""

    def __init__(self, client: redis.asyncio.Redis) -> None:
        self.enqueue: AsyncScript = client.register_script(source("enqueue"))
        self.schedule: AsyncScript = client.register_script(source("schedule"))
        self.pop: AsyncScript = client.register_script(source("pop"))
        self.ack: AsyncScript = client.register_script(source("ack"))
        self.nack: AsyncScript = client.register_script(source("nack"))
        self.release: AsyncScript = client.register_script(source("release"))
        self.extend: AsyncScript = client.register_script(source("extend"))
        self.redrive: AsyncScript = client.register_script(source("redrive"))
