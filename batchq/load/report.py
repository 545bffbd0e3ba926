"""A load run's report: the ``--json`` object, the table, and the HTML / PNG plots.

The JSON object has exactly these fields: ``offered_rate``, ``achieved_rate``,
``sent``, ``errors``, ``errors_by_type`` (type -> ``{"count", "example"}``), ``run_ms``,
``start_ms``, ``done_ms`` (each ``p50``, ``p90``, ``p99``, ``p999``, ``max``) and
``timeline`` (per second from the start: ``t``, ``sent``, ``done``, ``errors``,
``p99_run_ms``), and ``status`` (``complete``, ``aborted`` or ``incomplete``: the
schedule was not kept) with its ``reason``. The table adds what explains the figures:
the run id, the profile, send lateness, the merge cost, and who was the bottleneck.

The HTML page is self-contained (inline SVG, no script, no CDN); the PNG needs
matplotlib.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from .merge import RunData
from .schedule import Histogram, Profile

__all__ = ["bottlenecks", "build", "incomplete", "render", "status", "write_html",
           "write_png"]

LATE_P99_MS = 5.0
"""Send lateness p99 above this: the generator, not the target, limited the run (a
few ms of lateness are noise on a busy machine, and are measured around anyway)."""


def _summary(h: Histogram) -> dict[str, float]:
    s = h.summary_ms()
    return {"p50": round(s["p50"], 3), "p90": round(s["p90"], 3), "p99": round(s["p99"], 3),
            "p999": round(s["p99.9"], 3), "max": round(s["max"], 3)}


def timeline(run: RunData) -> list[dict[str, Any]]:
    """Per second from the run's start: sent, done, errors, run p50 / p99 (ms)."""
    if not run.seconds:
        return []
    first = int(run.start_s) if run.start_s else min(run.seconds)
    last = max(run.seconds)
    out = []
    for sec in range(min(first, min(run.seconds)), last + 1):
        s = run.seconds.get(sec)
        h: Histogram = s["run"] if s else Histogram()
        out.append({"t": sec - first, "x": sec + 0.5 - (run.start_s or first),
                    "sent": s["sent"] if s else 0,
                    "done": s["done"] if s else 0, "errors": s["errors"] if s else 0,
                    "p99_run_ms": round(h.percentile_s(99) * 1000, 3),
                    "p50_run_ms": round(h.percentile_s(50) * 1000, 3)})
    return out


def status(run: RunData) -> str:
    """``complete``, ``aborted`` (an abort rule, or by hand) or ``incomplete`` (the
    producers could not keep the schedule, or jobs were left when the run ended)."""
    got = run.meta.get("status", "")
    return got if got in ("aborted", "incomplete") else "complete"


def incomplete(run: RunData, settle_s: float, wedged: bool) -> str:
    """Why a run that ended without an abort is incomplete ("" when it is not): jobs
    never sent, producer processes that had to be stopped, or jobs not done when the
    settle time (``--settle``) ran out."""
    from .driver import SEND_GRACE_S

    if status(run) != "complete":
        return ""
    why = []
    unsent = run.num("unsent")
    if unsent:
        scheduled = run.sent + unsent
        why.append(f"the producers could not keep the schedule: they sent {run.sent:,} "
                   f"of {scheduled:,} jobs ({run.sent * 100 / max(1, scheduled):.0f} %) "
                   f"by {SEND_GRACE_S:g} s after its end, when they stop; add --producers "
                   "or machines (--join), or lower the rate")
    if wedged:
        why.append("producer processes had to be stopped")
    left = run.sent - run.done - run.num("skipped")
    if left > 0:
        why.append(f"{left:,} jobs sent were not done {settle_s:g} s after the last send "
                   "(--settle): they are acknowledged without running")
    return "; ".join(why)


def build(run: RunData) -> dict[str, Any]:
    """The ``--json`` object."""
    return {
        "status": status(run),
        "reason": run.meta.get("reason", ""),
        "offered_rate": round(run.offered_rate, 3),
        "achieved_rate": round(run.achieved_rate, 3),
        "sent": run.sent,
        "errors": run.errors,
        "errors_by_type": run.errors_by_type,
        "run_ms": _summary(run.hists["r"]),
        "start_ms": _summary(run.hists["s"]),
        "done_ms": _summary(run.hists["d"]),
        "timeline": [{k: v for k, v in row.items() if k not in ("p50_run_ms", "x")}
                     for row in timeline(run)],
    }


def bottlenecks(run: RunData) -> list[str]:
    """Plain sentences on who limited the run: the generator, the workers, the target."""
    out = []
    late = run.hists["l"]
    if late.count and late.percentile_s(99) * 1000 > LATE_P99_MS:
        out.append(f"the generator was a bottleneck: send lateness p99 "
                   f"{late.percentile_s(99) * 1000:.1f} ms (jobs went out late; latencies "
                   "still count from the intended times). Add --producers or machines "
                   "(--join).")
    if run.num("send_errors"):
        out.append(f"{run.num('send_errors'):,} jobs could not be sent (see send: errors)")
    start, run_h = run.hists["s"], run.hists["r"]
    if start.count and start.percentile_s(99) > max(0.05, 2 * run_h.percentile_s(99)):
        out.append(f"the fleet was a bottleneck: enqueue-to-start p99 "
                   f"{start.percentile_s(99) * 1000:.0f} ms against a run time p99 of "
                   f"{run_h.percentile_s(99) * 1000:.0f} ms: jobs waited for a worker. "
                   "Add workers or concurrency to load the target harder.")
    if not out and run.done:
        out.append("neither the generator nor the fleet limited the run: the latencies "
                   "are the target's")
    return out


def render(run: RunData, report: dict[str, Any]) -> str:
    """The report as a markdown table."""
    def row(h: dict[str, float]) -> str:
        return " / ".join(f"{h[k]:.2f}" for k in ("p50", "p90", "p99", "p999", "max")) + " ms"

    m = run.meta
    rows = [
        ("run", f"{m.get('run_id', '')} task {m.get('task', '?')} (queue "
                f"{m.get('queue', '?')}), {m.get('describe', '')}"),
        ("status", status(run) + (f": {m['reason']}" if m.get("reason") else "")),
        ("offered / achieved rate", f"{report['offered_rate']:,.1f} / "
                                    f"{report['achieved_rate']:,.1f} jobs/s"),
        ("sent / done / errors", f"{report['sent']:,} / {run.done:,} / {report['errors']:,}"
         + (f" ({run.num('skipped'):,} skipped: the run was over)" if run.num("skipped")
            else "")
         + (f" ({run.num('unsent'):,} never sent)" if run.num("unsent") else "")),
        ("run time p50 / p90 / p99 / p99.9 / max", row(report["run_ms"])),
        ("enqueue-to-start", row(report["start_ms"])),
        ("enqueue-to-done", row(report["done_ms"])),
        ("send lateness", row(_summary(run.hists["l"]))),
        ("producers", m.get("producers", "?")),
        ("Redis calls to merge the figures", f"{run.num('merges'):,} ("
         f"{run.num('merges') * 1000 / max(1, run.sent):.2f} per 1,000 jobs)"),
    ]
    for kind, e in report["errors_by_type"].items():
        rows.append((f"error {kind}", f"{e['count']:,}: {e['example']}"))
    for note in bottlenecks(run):
        rows.append(("note", note))
    out = ["| figure | value |", "|---|---|"]
    out += [f"| {k} | {str(v).replace('|', '/')} |" for k, v in rows]
    return "\n".join(out)


# --- plots ------------------------------------------------------------------------------


def _svg_chart(title: str, xs: list[float], series: list[tuple[str, str, list[float]]],
               marks: list[float], unit: str, w: int = 900, h: int = 260) -> str:
    pad_l, pad_b, pad_t = 60, 30, 24
    x_max = max(xs[-1] if xs else 1, marks[-1] if marks else 1, 1)
    y_max = max([max(v) for _, _, v in series if v] + [1e-9]) * 1.1
    def px(x: float) -> float:
        return pad_l + x / x_max * (w - pad_l - 10)
    def py(y: float) -> float:
        return h - pad_b - y / y_max * (h - pad_b - pad_t)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
             f'font-family="sans-serif" font-size="11">',
             f'<text x="{pad_l}" y="14" font-weight="bold">{html.escape(title)}</text>',
             f'<line x1="{pad_l}" y1="{h - pad_b}" x2="{w - 10}" y2="{h - pad_b}" '
             'stroke="#999"/>',
             f'<line x1="{pad_l}" y1="{pad_t}" x2="{pad_l}" y2="{h - pad_b}" stroke="#999"/>']
    for i in range(5):
        y = y_max * i / 4
        parts.append(f'<text x="{pad_l - 4}" y="{py(y) + 4:.1f}" text-anchor="end">'
                     f'{y:,.1f}</text>')
    for i in range(6):
        x = x_max * i / 5
        parts.append(f'<text x="{px(x):.1f}" y="{h - pad_b + 14}" text-anchor="middle">'
                     f'{x:.0f} s</text>')
    for m in marks:
        parts.append(f'<line x1="{px(m):.1f}" y1="{pad_t}" x2="{px(m):.1f}" '
                     f'y2="{h - pad_b}" stroke="#aaa" stroke-dasharray="4 3"/>')
    for n, (name, color, ys) in enumerate(series):
        pts = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in zip(xs, ys, strict=False))
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" '
                     f'points="{pts}"/>')
        parts.append(f'<text x="{w - 10}" y="{pad_t + 12 * n}" text-anchor="end" '
                     f'fill="{color}">{html.escape(name)} ({unit})</text>')
    parts.append("</svg>")
    return "".join(parts)


def _series(report: dict[str, Any], run: RunData) -> tuple[list[float], dict[str, list[float]]]:
    rows = timeline(run)
    xs = [max(0.0, float(r["x"])) for r in rows]
    return xs, {k: [float(r[k]) for r in rows]
                for k in ("sent", "done", "errors", "p99_run_ms", "p50_run_ms")}


def write_html(path: Path, run: RunData, report: dict[str, Any],
               profile: Profile | None) -> None:
    xs, s = _series(report, run)
    marks = profile.boundaries_s if profile else []
    lat = _svg_chart("task run time per second", xs, [("p99", "#c0392b", s["p99_run_ms"]),
                     ("p50", "#2980b9", s["p50_run_ms"])], marks, "ms")
    thr = _svg_chart("throughput per second", xs, [("sent", "#7f8c8d", s["sent"]),
                     ("done", "#27ae60", s["done"]), ("errors", "#c0392b", s["errors"])],
                     marks, "jobs/s")
    table = render(run, report).splitlines()[2:]
    cells = "".join("<tr>" + "".join(f"<td>{html.escape(c.strip())}</td>"
                                     for c in line.strip("|").split(" | ")) + "</tr>"
                    for line in table)
    path.write_text(
        "<!doctype html><html><head><meta charset='utf-8'><title>batchq load run "
        f"{html.escape(run.meta.get('run_id', ''))}</title><style>body{{font-family:"
        "sans-serif;margin:2em}}td{padding:2px 8px;border-bottom:1px solid #eee}"
        "</style></head><body>"
        f"<h1>batchq bench load: {html.escape(run.meta.get('task', ''))}</h1>"
        f"{lat}<br>{thr}<p>Dashed lines: steps of the rate profile.</p>"
        f"<table>{cells}</table></body></html>", encoding="utf-8")


def write_png(path: Path, run: RunData, report: dict[str, Any],
              profile: Profile | None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs, s = _series(report, run)
    fig, (a, b) = plt.subplots(2, 1, figsize=(10, 6.5), sharex=True)
    a.plot(xs, s["p99_run_ms"], color="#c0392b", label="run time p99")
    a.plot(xs, s["p50_run_ms"], color="#2980b9", label="run time p50")
    a.set_ylabel("ms")
    a.set_ylim(bottom=0)
    a.legend(loc="upper left")
    b.plot(xs, s["sent"], color="#7f8c8d", label="sent/s")
    b.plot(xs, s["done"], color="#27ae60", label="done/s")
    b.plot(xs, s["errors"], color="#c0392b", label="errors/s")
    b.set_ylabel("jobs per second")
    b.set_xlabel("seconds since the start")
    b.legend(loc="upper left")
    for m in profile.boundaries_s if profile else []:
        a.axvline(m, color="#999", linestyle="--", linewidth=0.8)
        b.axvline(m, color="#999", linestyle="--", linewidth=0.8)
    over = status(run)
    fig.suptitle(f"batchq bench load {run.meta.get('task', '')}: "
                 f"{run.meta.get('describe', '')}"
                 + (f"\n{over}: {run.meta.get('reason', '')}" if over != "complete"
                    else ""), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
