"""``batchq breaker ls|open|close MODULE:APP [NAME]``: the app's circuit breakers
(``batchq.flow.breaker``) as Redis has them (state, time left open, failures in the window,
probes, trips, jobs re-routed by the tasks bound to each), and an operator's open or
close. Breakers are declared in the app (``app.breaker(...)``), so the app is required.
Open and close each leave an entry in the audit log (``batchq audit``).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, NoReturn

from ..flow.breaker import Breaker, states
from ..tasks.durations import check_seconds
from ..worker import exitcodes
from .audit import audited
from .common import Target, add_common, dumps, duration, guarded, load, out, table, target, usage
from .flags import seconds

USAGE = ("batchq breaker {ls,open,close} MODULE:APP [NAME] [--open-s S] [--json] "
         "[--redis-url URL] [--namespace NS]")


def _one_line_errors(p: argparse.ArgumentParser) -> None:
    def error(message: str) -> NoReturn:
        sys.stderr.write(f"{p.prog}: {message}\n")
        sys.exit(exitcodes.EXIT_USAGE)

    p.error = error  # type: ignore[method-assign]


def _app(args: argparse.Namespace) -> tuple[Target, dict[str, Breaker]]:
    if not args.where or ":" not in args.where[0]:
        raise usage("breakers are declared in the app: give MODULE:APP first")
    args.app = args.where[0]
    loaded = load(args.app)
    t = target(args, loaded)
    # the breakers as the app declares them, on the Redis and namespace resolved here
    brs = {n: Breaker(t.app.clients, b.config) for n, b in loaded.breakers.items()}
    return t, brs


def _named(args: argparse.Namespace, brs: dict[str, Breaker]) -> Breaker:
    if len(args.where) != 2:
        raise usage(f"expected MODULE:APP NAME (the app has: {', '.join(sorted(brs)) or 'none'})")
    name = args.where[1]
    if name not in brs:
        raise usage(f"no breaker named {name!r} in {args.app} (it has: "
                    f"{', '.join(sorted(brs)) or 'none'})")
    return brs[name]


def _rerouted(t: Target, loaded_tasks: dict[str, Any], name: str) -> int:
    r = t.app.redis
    n = 0
    for task in loaded_tasks.values():
        if task.config.breaker == name:
            n += int(r.hget(t.app.keys(task.config.queue).stats, f"rerouted:{task.name}")
                     or 0)
    return n


def cmd_breaker(args: argparse.Namespace) -> int:
    t, brs = _app(args)
    if args.action == "ls":
        if len(args.where) > 2:
            raise usage("expected MODULE:APP [NAME]")
        chosen = {n: b for n, b in brs.items() if len(args.where) == 1 or n == args.where[1]}
        if len(args.where) == 2 and not chosen:
            _named(args, brs)
        tasks = t.loaded.tasks if t.loaded is not None else {}
        rows = []
        for st in states(chosen):
            d = st.as_dict()
            d["rerouted"] = _rerouted(t, tasks, st.name)
            rows.append(d)
        if args.json:
            out(dumps(rows))
            return exitcodes.EXIT_OK
        if not rows:
            out(f"{args.app} declares no circuit breakers")
            return exitcodes.EXIT_OK
        out(table(["NAME", "STATE", "OPEN LEFT", "FAILURES", "PROBES", "TRIPS", "REROUTED"],
                  [[d["name"], d["state"], duration(d["open_left_s"]) if d["open_left_s"]
                    else "-", f"{d['failures']}/{d['threshold']} in {d['within_s']:g}s",
                    f"{d['probes']} ({d['succeeded']}/{d['half_open_jobs']} ok)",
                    str(d["trips"]), str(d["rerouted"])] for d in rows], right={5, 6}))
        return exitcodes.EXIT_OK
    b = _named(args, brs)
    if args.action == "open":
        try:
            secs = b.config.open_s if args.open_s is None else \
                check_seconds("--open-s", args.open_s, positive=True, max_s=86400)
        except (TypeError, ValueError) as exc:
            raise usage(str(exc)) from None
        with audited(t, "breaker_open", f"breaker {b.name}", f"{secs:g}s") as note:
            before, _ = b.open(secs)
            note.detail = f"{secs:g}s (was {before})"
        if args.json:
            out(dumps({"name": b.name, "state": "open", "open_s": secs, "was": before}))
        else:
            out(f"breaker {b.name} is open for {duration(secs)} (was {before}): jobs of "
                f"its tasks are held or re-routed; batchq breaker close {args.app} "
                f"{b.name} closes it")
        return exitcodes.EXIT_OK
    with audited(t, "breaker_close", f"breaker {b.name}") as note:
        before, left = b.close()
        note.detail = f"was {before}"
    if args.json:
        out(dumps({"name": b.name, "state": "closed", "was": before,
                   "open_left_s": round(left, 3)}))
    else:
        out(f"breaker {b.name} is closed (was {before}"
            + (f", {duration(left)} left open" if left else "") + ")")
    return exitcodes.EXIT_OK


def add_commands(sub: Any) -> None:
    p = sub.add_parser(
        "breaker", usage=USAGE,
        help="list, open or close the app's circuit breakers",
        description="ls: each circuit breaker of the app with its state in Redis, shared "
        "by the fleet (closed, open with the time left, half-open with its probes), the "
        "failures in its window, its trips and the jobs re-routed to fallbacks. open: "
        "open it now (for --open-s, default its open_s): the jobs of its tasks are held "
        "or re-routed; close: close it now. Open and close are audited.")
    p.add_argument("action", choices=("ls", "open", "close"),
                   help="ls: every breaker's state; open / close: force one open or closed")
    p.add_argument("where", nargs="*", metavar="MODULE:APP [NAME]",
                   help="the app and a breaker's name")
    add_common(p, app=False)
    p.add_argument("--open-s", type=seconds(zero_ok=False, high=86400), default=None, metavar="S",
                   help="open: for this many seconds (default: the breaker's open_s)")
    p.add_argument("--json", action="store_true", help="print JSON")
    _one_line_errors(p)
    p.set_defaults(handler=guarded("breaker", cmd_breaker))
