"""Plot dlslime-bench results: bandwidth and latency against message size.

    python -m dlslime.bench_plot RESULT.json [MORE.json ...] -o plot.png

Each JSON file is what ``dlslime-bench --json`` writes; several files (e.g. write, read
and send) are drawn on the same axes. ``dlslime-bench --plot FILE.png`` calls this module.
Needs matplotlib.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import List, Optional


def _label(config: dict) -> str:
    label = f"{config.get('transport', '?')} {config.get('op', '?')}"
    extras = []
    if config.get("lanes") is not None:
        extras.append(f"lanes {config['lanes']}")
    if config.get("layout"):
        extras.append(str(config["layout"]))
    if extras:
        label += f" ({', '.join(extras)})"
    return label


def _size_text(n: float) -> str:
    for unit, scale in (("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale and int(n) % scale == 0:
            return f"{int(n) // scale}{unit}"
    return str(int(n))


def plot(json_paths: List[str], out_path: str, title: Optional[str] = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    runs = []
    for path in json_paths:
        with open(path) as f:
            doc = json.load(f)
        if not isinstance(doc, dict) or "rows" not in doc or "config" not in doc:
            raise ValueError(f"{path} is not a dlslime-bench --json report")
        runs.append((path, doc["config"], sorted(doc["rows"], key=lambda r: r["msg_size"])))

    labels = [_label(config) for _, config, _ in runs]
    # Runs that would share a label (same op and options) are told apart by file name.
    labels = [f"{lab} [{os.path.basename(path)}]" if labels.count(lab) > 1 else lab
              for lab, (path, _, _) in zip(labels, runs)]

    fig, (bw_ax, lat_ax) = plt.subplots(1, 2, figsize=(13, 5))
    for label, (path, config, rows) in zip(labels, runs):
        if not rows:
            continue
        sizes = [r["msg_size"] for r in rows]
        line = bw_ax.plot(sizes, [r["avg_bw_gbps"] for r in rows], marker="o", label=f"{label} avg")[0]
        bw_ax.plot(sizes, [r["max_bw_gbps"] for r in rows], linestyle="--", color=line.get_color(),
                   label=f"{label} max")
        line = lat_ax.plot(sizes, [r["avg_lat_us"] for r in rows], marker="o", label=f"{label} avg")[0]
        lat_ax.plot(sizes, [r["p99_lat_us"] for r in rows], linestyle="--", color=line.get_color(),
                    label=f"{label} p99")
        lat_ax.plot(sizes, [r["min_lat_us"] for r in rows], linestyle=":", color=line.get_color(),
                    label=f"{label} min")

    batch = runs[0][1].get("batch", "?")
    for ax in (bw_ax, lat_ax):
        ax.set_xscale("log", base=2)
        ax.set_xlabel(f"message size (bytes), batch {batch}")
        ax.grid(True, which="both", alpha=0.3)
        ticks = sorted({r["msg_size"] for _, _, rows in runs for r in rows})
        if ticks:
            ax.set_xticks(ticks)
            ax.set_xticklabels([_size_text(t) for t in ticks], rotation=45, fontsize=8)
        ax.legend(fontsize=8)
    bw_ax.set_ylabel("bandwidth (GB/s, 1e9 B/s)")
    bw_ax.set_title("Bandwidth per batch")
    lat_ax.set_yscale("log")
    lat_ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    lat_ax.set_ylabel("latency per batch (us)")
    lat_ax.set_title("Batch latency")
    first = runs[0][1]
    fig.suptitle(title or f"dlslime-bench: {first.get('transport', '?')}, {first.get('mode', '')} "
                 f"on {first.get('hostname', '?')}")
    fig.tight_layout()
    fig.savefig(out_path, dpi=110)
    plt.close(fig)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dlslime.bench_plot", description=__doc__.splitlines()[0])
    parser.add_argument("json", nargs="+", help="dlslime-bench --json reports")
    parser.add_argument("-o", "--output", required=True, help="PNG file to write")
    parser.add_argument("--title", help="figure title")
    args = parser.parse_args(argv)
    try:
        plot(args.json, args.output, args.title)
    except ImportError as e:
        sys.stderr.write(f"dlslime.bench_plot: matplotlib is needed for plots: {e}\n")
        return 1
    except (OSError, ValueError, KeyError) as e:
        sys.stderr.write(f"dlslime.bench_plot: {e}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
