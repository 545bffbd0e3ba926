"""``python -m bench plot RECORD.json ... -o bench/latency.png``.

Enqueue-to-start latency against the offered rate, log-log, one colour per system and
one panel per percentile (p50, p99): batchq's from ``latency`` records, every system's
from ``peers`` records. A ``peers`` curve ends at the first rate its system did not
sustain, drawn as a cross (dashed from the last rate it did sustain); a curve with no cross
kept up at every rate offered. matplotlib comes with the ``bench`` extra (``pip install
-e .[bench]``); it is imported only here.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

PERCENTILES = ("p50", "p99", "max")
PANELS = ("p50", "p99")
JITTER = 1.03

Point = dict[str, Any]
"""``{"p50": ms, "p99": ms, "max": ms, "sustained": bool}``"""


def points(records: Sequence[dict[str, Any]]) -> dict[str, dict[float, Point]]:
    """``{system: {offered rate: point}}`` from the records; where several records
    measured one system at one rate, the first given wins. A ``peers`` record's levels
    are taken up to the first one not sustained (included)."""
    out: dict[str, dict[float, Point]] = {}
    for rec in records:
        scenario = rec.get("scenario")
        if scenario == "latency":
            for row in rec["rows"]:
                rate = float(row["params"]["offered_rate"])
                figs = row["figures"]
                out.setdefault("batchq", {}).setdefault(rate, {
                    **{k: figs[f"start {k}"]["median"] for k in PERCENTILES},
                    "sustained": True})
        elif scenario == "peers":
            for system, res in rec.get("results", {}).items():
                for lv in sorted(res["latency"], key=lambda lv: float(lv["offered_rate"])):
                    ok = bool(lv.get("sustained", True))
                    out.setdefault(system, {}).setdefault(float(lv["offered_rate"]), {
                        **{k: lv["enqueue_to_start"][k] for k in PERCENTILES},
                        "sustained": ok})
                    if not ok:
                        break
        else:
            raise ValueError(f"cannot plot a {scenario!r} record (latency or peers only)")
    return out


def curve(by_rate: dict[float, Point]) -> tuple[list[float], float | None]:
    """The rates a system kept up at (ascending, up to its first miss) and the first
    rate it did not sustain (None: it kept up at every rate drawn)."""
    kept: list[float] = []
    for rate in sorted(by_rate):
        if not by_rate[rate]["sustained"]:
            return kept, rate
        kept.append(rate)
    return kept, None


def plot(paths: Sequence[Path], output: Path) -> Path:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise SystemExit("plot needs matplotlib: pip install -e '.[bench]'") from exc
    records = [json.loads(Path(p).read_text()) for p in paths]
    data = points(records)
    if not data:
        raise SystemExit("no latency figures in the given records")
    fig, axes = plt.subplots(1, len(PANELS), figsize=(13, 5.5), dpi=120, sharey=True)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    systems = sorted(data.items(), key=lambda kv: (kv[0] != "batchq", kv[0]))
    for i, (system, by_rate) in enumerate(systems):
        kept, missed = curve(by_rate)
        # systems measured at the same rate are spread a little sideways (log x) so
        # that their markers do not hide each other
        shift = JITTER ** (i - (len(systems) - 1) / 2)
        colour = colours[i % len(colours)]
        width = 2.4 if system == "batchq" else 1.3
        label = system + (f" (falls behind at {missed:,.0f}/s)" if missed is not None
                          else f" (kept up to {kept[-1]:,.0f}/s)" if kept else "")
        for ax, key in zip(axes, PANELS, strict=True):
            ax.plot([r * shift for r in kept], [by_rate[r][key] for r in kept],
                    marker="o", markersize=4, linewidth=width, color=colour,
                    label=label if key == PANELS[0] else None)
            if missed is not None:
                if kept:
                    ax.plot([kept[-1] * shift, missed * shift],
                            [by_rate[kept[-1]][key], by_rate[missed][key]],
                            linestyle="--", linewidth=width, color=colour)
                ax.plot([missed * shift], [by_rate[missed][key]], marker="x",
                        markersize=11, markeredgewidth=2.5, color=colour, linestyle="none")
    for ax, key in zip(axes, PANELS, strict=True):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("offered rate (jobs/s, open loop)")
        ax.set_title(f"{key}", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("enqueue-to-start latency (ms, from the intended send time)")
    stamps = sorted({r.get("timestamp", "") for r in records})
    host = records[0].get("machine", {})
    fig.suptitle(f"Enqueue-to-start latency against offered rate; a cross marks the first rate not "
                 f"sustained (the queue falls behind); {host.get('cpu_count', '?')} cores; "
                 f"{stamps[0]}" + (f" .. {stamps[-1]}" if len(stamps) > 1 else ""),
                 fontsize=10)
    fig.legend(fontsize=8, loc="center left", bbox_to_anchor=(0.83, 0.5))
    fig.tight_layout(rect=(0, 0, 0.83, 1))
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output)
    plt.close(fig)
    return output
