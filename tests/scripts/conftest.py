"""Fixtures shared by the Lua script tests."""

from __future__ import annotations

import pytest
import redis

from batchq.keys import QueueKeys
from batchq.scripts import SyncScripts


@pytest.fixture
def k(namespace: str, queue_name: str) -> QueueKeys:
    return QueueKeys(namespace, queue_name)


@pytest.fixture
def s(redis_client: redis.Redis) -> SyncScripts:
    return SyncScripts(redis_client)
