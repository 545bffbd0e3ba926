"""``python -m bench plot RECORD.json ... -o bench/latency.png``.

Enqueue-to-start latency percentiles (p50, p99, max) against the offered rate, one
colour per system, log-scaled: batchq's from ``latency`` records, every system's from
``peers`` records. matplotlib comes with the ``bench`` extra (``pip install -e
.[bench]``); it is imported only here.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

PLOTTED = (("p50", "-", "o"), ("p99", "--", "s"), ("max", ":", "^"))
JITTER = 1.04


def points(records: Sequence[dict[str, Any]]) -> dict[str, dict[float, dict[str, float]]]:
    """``{system: {offered rate: {"p50": ms, "p99": ms, "max": ms}}}`` from the records;
    where several records measured one system at one rate, the first given wins."""
    out: dict[str, dict[float, dict[str, float]]] = {}
    for rec in records:
        scenario = rec.get("scenario")
        if scenario == "latency":
            for row in rec["rows"]:
                rate = float(row["params"]["offered_rate"])
                figs = row["figures"]
                out.setdefault("batchq", {}).setdefault(rate, {
                    k: figs[f"start {k}"]["median"] for k, _, _ in PLOTTED})
        elif scenario == "peers":
            for system, res in rec.get("results", {}).items():
                for lv in res["latency"]:
                    if not lv.get("sustained", True):
                        continue
                    out.setdefault(system, {}).setdefault(float(lv["offered_rate"]), {
                        k: lv["enqueue_to_start"][k] for k, _, _ in PLOTTED})
        else:
            raise ValueError(f"cannot plot a {scenario!r} record (latency or peers only)")
    return out


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
    fig, ax = plt.subplots(figsize=(11, 5.5), dpi=120)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    systems = sorted(data.items(), key=lambda kv: (kv[0] != "batchq", kv[0]))
    for i, (system, by_rate) in enumerate(systems):
        rates = sorted(by_rate)
        # systems measured at the same rate are spread a little sideways (log x) so
        # that their markers do not hide each other
        xs = [r * JITTER ** (i - (len(systems) - 1) / 2) for r in rates]
        colour = colours[i % len(colours)]
        for key, style, marker in PLOTTED:
            ax.plot(xs, [by_rate[r][key] for r in rates], linestyle=style, marker=marker,
                    color=colour, label=f"{system} {key}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("offered rate (jobs/s, open loop)")
    ax.set_ylabel("enqueue-to-start latency (ms, from the intended send time)")
    stamps = sorted({r.get("timestamp", "") for r in records})
    host = records[0].get("machine", {})
    ax.set_title(f"Enqueue-to-start latency against offered rate, open loop; "
                 f"{host.get('cpu_count', '?')} cores; {stamps[0]}"
                 + (f" .. {stamps[-1]}" if len(stamps) > 1 else ""), fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=1, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output)
    plt.close(fig)
    return output
