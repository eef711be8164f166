"""``python -m benchmarks.plot``: PNG figures from benchmark results files.

    python -m benchmarks.plot benchmarks/results/sc.jsonl [--out benchmarks/results]

For each results file it takes the latest run (``run_id``) and draws ``<workload>_speedup.png``
(wall-time speed-up per dataset and mode, against no-cache and against exact) and
``<workload>_accuracy.png`` (accuracy per dataset and mode with 95% intervals, and the difference
to exact). Given a stop-rule curve (``<workload>_stop_curve*.json``, written by the benchmark)
it draws ``<name>.png``: tokens saved against vote agreement with the full vote, one line per
rule family and dataset, each point labelled with its threshold. A run with blend's recompute
sweep (``asks-blend@R`` modes) also gets ``<workload>_recompute_sweep.png``: quality (median
first-token KL, vote agreement with exact) against speed-up over exact, one point per share,
beside the server-default blend, adoption and the two-seed noise floor (``exact-reseed``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from benchmarks.bench.modes import SWEEP_PREFIX  # noqa: E402
from benchmarks.bench.records import latest_run  # noqa: E402


def _grouped_bars(ax, rows, datasets, modes, value, title, baseline_line=None, errors=None):
    width = 0.8 / max(len(modes), 1)
    for i, mode in enumerate(modes):
        xs, ys, errs = [], [], []
        for j, dataset in enumerate(datasets):
            row = next((r for r in rows if r["dataset"] == dataset and r["mode"] == mode), None)
            if row is None or value(row) is None:
                continue
            xs.append(j + (i - (len(modes) - 1) / 2) * width)
            ys.append(value(row))
            errs.append(errors(row) if errors else None)
        yerr = None
        if errors and xs:
            yerr = [[y - e[0] for y, e in zip(ys, errs)], [e[1] - y for y, e in zip(ys, errs)]]
        ax.bar(xs, ys, width, label=mode, yerr=yerr, capsize=3)
    if baseline_line is not None:
        ax.axhline(baseline_line, color="black", linewidth=0.8, linestyle="--")
    ax.set_xticks(range(len(datasets)), datasets)
    ax.set_title(title)
    ax.legend(fontsize=8)


SPEEDUPS = (("speedup_vs_no_cache", "speed-up vs no-cache (wall time)"),
            ("speedup_vs_exact", "speed-up vs exact prefix caching"))


def speedup_panels(rows: list[dict]) -> list[tuple[str, str]]:
    """The speed-up panels a run has data for (a run without ``no-cache`` has no first panel)."""
    return [(key, title) for key, title in SPEEDUPS if any(r.get(key) is not None for r in rows)] or [SPEEDUPS[1]]


def plot(path: Path, out_dir: Path) -> list[Path]:
    rows = latest_run(path)
    workload = rows[0]["workload"]
    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    modes = list(dict.fromkeys(r["mode"] for r in rows))
    caption = f"{workload}, {rows[0]['model']}, n={rows[0]['n_problems']}/dataset, commit {rows[0]['commit']}, {rows[0]['date']}"
    written = []

    panels = speedup_panels(rows)
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.5), squeeze=False)
    for ax, (key, title) in zip(axes[0], panels):
        _grouped_bars(ax, rows, datasets, modes, lambda r, key=key: r.get(key), title, 1.0)
    fig.suptitle(caption, fontsize=9)
    fig.tight_layout()
    written.append(out_dir / f"{workload}_speedup.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    _grouped_bars(axes[0], rows, datasets, modes, lambda r: r["accuracy"], "accuracy (95% Wilson interval)",
                  errors=lambda r: r["accuracy_ci95"])
    exact = {r["dataset"]: r["accuracy"] for r in rows if r["mode"] == "exact"}
    _grouped_bars(axes[1], rows, datasets, modes,
                  lambda r: None if r["dataset"] not in exact else r["accuracy"] - exact[r["dataset"]],
                  "accuracy minus exact", 0.0)
    fig.suptitle(caption, fontsize=9)
    fig.tight_layout()
    written.append(out_dir / f"{workload}_accuracy.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)
    if any(r["mode"].startswith(SWEEP_PREFIX) for r in rows):
        written.append(plot_sweep(rows, out_dir / f"{workload}_recompute_sweep.png", caption))
    return written


KL_TARGET = 0.02  # issue 35's bar: median first-token KL at the shipped default
SWEEP_PANELS = (("first_token_kl_median", "median first-token KL vs exact (log; 0 drawn at 1e-6)"),
                ("answer_agreement_vs_exact", "vote agrees with exact"))


def _kl_floor(key: str, y: float) -> float:
    return max(y, 1e-6) if "kl" in key else y  # a log axis: KL 0 drawn at 1e-6


def plot_sweep(rows: list[dict], out: Path, caption: str) -> Path:
    """Quality (columns: median first-token KL, vote agreement) against speed (rows: wall-time
    speed-up over exact, and prefill computed relative to exact, which the machine's load does
    not move) for every recompute share of the sweep, per dataset, with the server-default blend
    (``asks-only``), adoption (``asks-adopt``), the two-seed floor of vote agreement
    (``exact-reseed``) and the KL target as references."""
    xs = (("speedup_vs_exact", "speed-up over exact (wall time)"),
          ("prefill_computed_vs_exact", "prefill computed / exact's"))
    fig, axes = plt.subplots(2, 2, figsize=(12, 9.5))
    for dataset in dict.fromkeys(r["dataset"] for r in rows):
        mine = [r for r in rows if r["dataset"] == dataset]
        sweep = sorted((r for r in mine if r["mode"].startswith(SWEEP_PREFIX)), key=lambda r: r["asks_recompute_asked"])
        floor = {key: next((r.get(key) for r in mine if r["mode"] == "exact-reseed"), None) for key, _ in SWEEP_PANELS}
        for (xkey, _), row_axes in zip(xs, axes):
            for ax, (key, _) in zip(row_axes, SWEEP_PANELS):
                points = [(r[xkey], _kl_floor(key, r[key]), r["asks_recompute_asked"]) for r in sweep
                          if r.get(xkey) is not None and r.get(key) is not None]
                if points:
                    line, = ax.plot([x for x, _, _ in points], [y for _, y, _ in points], marker="o",
                                    label=f"{dataset} blend sweep")
                    for x, y, share in points:
                        ax.annotate(f"{share:g}", (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points",
                                    color=line.get_color())
                for mode, marker in (("asks-only", "*"), ("asks-adopt", "x")):
                    r = next((r for r in mine if r["mode"] == mode), None)
                    if r and r.get(xkey) is not None and r.get(key) is not None:
                        ax.scatter([r[xkey]], [_kl_floor(key, r[key])], marker=marker, s=70, label=f"{dataset} {mode}")
                if floor[key] is not None and "kl" not in key:
                    ax.axhline(floor[key], linestyle=":", color="gray", linewidth=1,
                               label=f"{dataset}: two seeds of exact")
    for (xkey, xlabel), row_axes in zip(xs, axes):
        for ax, (key, title) in zip(row_axes, SWEEP_PANELS):
            if "kl" in key:
                ax.set_yscale("log")
                ax.axhline(KL_TARGET, color="black", linewidth=0.8, linestyle="--")
            ax.axvline(1.0, color="black", linewidth=0.8, linestyle="--")
            ax.set_xlabel(xlabel)
            ax.set_title(title)
            ax.legend(fontsize=7)
    fig.suptitle(caption + " (labels: recompute share)", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def plot_curve(path: Path, out_dir: Path) -> list[Path]:
    """Tokens saved vs vote agreement of every replayed stop rule (``benchmarks.bench.stop_replay``)."""
    data = json.loads(Path(path).read_text())
    fig, ax = plt.subplots(figsize=(7, 5))
    for dataset, entry in data["datasets"].items():
        for (family, applied_by), (marker, style) in {("esc", "rounds"): ("o", "-"), ("beta", "rounds"): ("s", "-"),
                                                      ("beta", "scheduler"): ("^", ":")}.items():
            points = [p for p in entry["points"]
                      if p["rule"].startswith(family) and p.get("applied_by", "rounds") == applied_by]
            if not points:
                continue
            line, = ax.plot([p["token_saving"] for p in points], [p["vote_agreement"] for p in points],
                            marker=marker, linestyle=style,
                            label=f"{dataset} {family}" + (" (scheduler)" if applied_by == "scheduler" else ""))
            for p in points:
                ax.annotate(p["rule"].split(":", 1)[1], (p["token_saving"], p["vote_agreement"]), fontsize=7,
                            xytext=(3, 3), textcoords="offset points", color=line.get_color())
    ax.axhline(0.95, color="black", linewidth=0.8, linestyle="--")
    ax.set_xlabel("completion tokens saved (replayed on exact's branches)")
    ax.set_ylabel("vote agrees with the full-N vote")
    offset = f", problems from offset {data['calibration_offset']}" if data.get("calibration_offset") else ""
    ax.set_title(f"{data['workload']}, N={data['num_branches']}, n={data['n_problems']}/dataset{offset}, "
                 f"commit {data['commit']}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out = out_dir / f"{Path(path).stem}.png"
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return [out]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.plot", description=__doc__.splitlines()[0])
    p.add_argument("results", nargs="+", type=Path, help="results files (JSON lines) or stop-rule curves (.json)")
    p.add_argument("--out", type=Path, default=None, help="folder for the PNGs (default: beside each file)")
    args = p.parse_args(argv)
    for path in args.results:
        if not path.is_file():
            p.error(f"results file not found: {path}")
        draw = plot_curve if path.suffix == ".json" else plot
        for png in draw(path, args.out or path.parent):
            print(png)


if __name__ == "__main__":
    main()
