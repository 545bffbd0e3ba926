"""``batchq campaign list|show|cancel`` as a user runs it (a real subprocess)."""

from __future__ import annotations

import json

import pytest
from fixtures.campaigns import *  # noqa: F403
from helpers import run_cli

pytestmark = pytest.mark.e2e


def _cli(redis_url: str, namespace: str, *args: str):  # type: ignore[no-untyped-def]
    return run_cli(["campaign", *args, "--redis-url", redis_url, "--namespace", namespace])


def test_campaign_commands(app, drain, redis_url, namespace):
    send = app.tasks["send"]
    c = app.campaign("cli-one", on_complete=app.tasks["report"])
    send.options(campaign=c).enqueue_many(range(5))
    c.seal()
    d = app.campaign("cli-two")
    send.options(campaign=d).enqueue_many(range(7))

    r = _cli(redis_url, namespace, "list", "--json")
    assert r.returncode == 0, r.stderr
    listed = {x["id"]: x for x in json.loads(r.stdout)["campaigns"]}
    assert listed["cli-one"]["total"] == 5 and listed["cli-two"]["state"] == "open"

    r = _cli(redis_url, namespace, "list")
    assert r.returncode == 0 and "cli-one" in r.stdout and "PENDING" in r.stdout

    r = _cli(redis_url, namespace, "cancel", "cli-two", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"id": "cli-two", "cancelled": 7}

    drain("a", "cb")
    r = _cli(redis_url, namespace, "show", "cli-one", "--json")
    shown = json.loads(r.stdout)
    assert (shown["state"], shown["succeeded"], shown["done"]) == ("done", 5, True)
    r = _cli(redis_url, namespace, "show", "cli-two")
    assert r.returncode == 0 and "cancelled:  7" in r.stdout

    # --watch on a finished campaign draws the bar once and stops
    r = _cli(redis_url, namespace, "show", "cli-one", "--watch", "--interval", "0.1")
    assert r.returncode == 0, r.stderr
    assert "5/5" in r.stdout and "state:      done" in r.stdout
    r = _cli(redis_url, namespace, "show", "cli-one", "--watch", "--json")
    assert r.returncode == 0 and json.loads(r.stdout.splitlines()[-1])["done"] is True


def test_campaign_command_errors(redis_url, namespace):
    r = _cli(redis_url, namespace, "show", "no-such")
    assert r.returncode == 1 and "no campaign 'no-such'" in r.stderr
    r = _cli(redis_url, namespace, "show")
    assert r.returncode == 2 and "needs a campaign ID" in r.stderr
    r = _cli(redis_url, namespace, "show", "bad{id}")
    assert r.returncode == 2 and "invalid campaign id" in r.stderr
    r = _cli(redis_url, namespace, "list", "--watch")
    assert r.returncode == 2 and "--watch applies to show" in r.stderr
    r = _cli(redis_url, namespace, "show", "x", "--interval", "nan")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    r = _cli(redis_url, namespace, "list", "--limit", "0")
    assert r.returncode == 2 and "Traceback" not in r.stderr
