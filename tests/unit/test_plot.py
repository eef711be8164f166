"""The plot command draws PNGs from the latest run in a results file."""

from __future__ import annotations

import json

from benchmarks.report.plot import plot
from benchmarks.bench.records import latest_run


def row(run_id, dataset, mode, speedup, acc):
    return {"run_id": run_id, "workload": "sc", "dataset": dataset, "mode": mode, "model": "m", "n_problems": 10,
            "commit": "abc", "date": "2026-11-29", "speedup_vs_no_cache": speedup, "speedup_vs_exact": speedup / 1.5,
            "accuracy": acc, "accuracy_ci95": [max(0.0, acc - 0.1), min(1.0, acc + 0.1)]}


def test_only_the_latest_run_is_drawn_and_both_figures_are_written(tmp_path):
    results = tmp_path / "sc.jsonl"
    rows = [row("1", "gsm8k", "exact", 1.2, 0.3)] + [
        row("2", d, m, s, a) for d in ("gsm8k", "gpqa") for m, s, a in (("no-cache", 1.0, 0.3), ("exact", 1.5, 0.3), ("rksc", 2.0, 0.25))
    ]
    results.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert {r["run_id"] for r in latest_run(results)} == {"2"}
    written = plot(results, tmp_path)
    assert [p.name for p in written] == ["sc_speedup.png", "sc_accuracy.png"]
    assert all(p.read_bytes()[:4] == b"\x89PNG" and p.stat().st_size > 10_000 for p in written)


def test_a_run_without_no_cache_draws_no_empty_panel(tmp_path):
    from benchmarks.report.plot import speedup_panels

    capped = [{**row("1", "gsm8k", m, 1.0, 0.3), "speedup_vs_no_cache": None} for m in ("exact", "rsbcm-only")]
    assert [key for key, _ in speedup_panels(capped)] == ["speedup_vs_exact"]
    full = [row("1", "gsm8k", m, 1.0, 0.3) for m in ("no-cache", "exact")]
    assert [key for key, _ in speedup_panels(full)] == ["speedup_vs_no_cache", "speedup_vs_exact"]
    results = tmp_path / "capped.jsonl"
    results.write_text("\n".join(json.dumps(r) for r in capped) + "\n")
    assert all(p.stat().st_size > 10_000 for p in plot(results, tmp_path))


def test_the_stop_rule_curve_is_drawn_from_its_json_file(tmp_path):
    from benchmarks.report.plot import plot_curve

    points = [{"rule": r, "token_saving": s, "vote_agreement": a}
              for r, s, a in (("esc:2", 0.5, 0.9), ("esc:3", 0.3, 0.97), ("beta:0.9", 0.4, 0.95))]
    path = tmp_path / "sc_stop_curve.json"
    path.write_text(json.dumps({"workload": "sc", "num_branches": 16, "n_problems": 20, "commit": "abc",
                                "datasets": {"arc-challenge": {"points": points}}}))
    (png,) = plot_curve(path, tmp_path)
    assert png.name == "sc_stop_curve.png" and png.read_bytes()[:4] == b"\x89PNG" and png.stat().st_size > 10_000


def test_a_recompute_sweep_gets_its_quality_against_speed_figure(tmp_path):
    rows = [{**row("1", "coqa", mode, 1.0, 0.3), "workload": "role-sc", "speedup_vs_exact": speed,
             "first_token_kl_median": kl, "answer_agreement_vs_exact": agree, "asks_recompute_asked": share,
             "prefill_computed_vs_exact": speed and 1 / speed}
            for mode, speed, kl, agree, share in (
                ("exact", 1.0, None, 1.0, None), ("exact-reseed", 1.0, 0.0, 0.7, None),
                ("asks-only", 2.1, 0.01, 0.8, None), ("asks-adopt", 1.1, 0.0, 0.9, None),
                ("asks-blend@0", 2.5, 0.2, 0.5, 0.0), ("asks-blend@0.15", 2.0, 0.01, 0.8, 0.15),
                ("asks-blend@1", 0.9, 0.0, 1.0, 1.0))]
    results = tmp_path / "role-sc.jsonl"
    results.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    written = plot(results, tmp_path)
    assert written[-1].name == "role-sc_recompute_sweep.png" and written[-1].stat().st_size > 10_000
