"""The agent workloads' table in a results section (``benchmarks.bench.agent_workloads``): time to
first token beside wall time, every mode against ``exact``; for ``agents`` each agent's share of
outputs identical to exact's, for ``bon-grader`` the verification phase and the grader's picks."""

from __future__ import annotations

from benchmarks.report.tables import _bench_row, _scope, latest_rows


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _per_agent(values: dict | None, spec: str) -> str:
    return " / ".join(f"{name} {format(v, spec)}" for name, v in values.items()) if values else "-"


def latency_table(rows: list[dict]) -> list[str]:
    """Rows that carry TTFT (``ttft_median_s``), one line each; empty for other workloads."""
    mine = [r for r in rows if r.get("ttft_median_s") is not None]
    if not mine:
        return []
    grader = any("grader_picks" in r for r in mine)
    what = ("each grader request's (its first token is its verdict)" if grader
            else "each agent's request's")
    out = ["", f"Time to first token, {what}, timed at the client on a streamed request, median and 90th "
           "percentile over every request of every repeat (x exact: exact's median over the row's)"
           + ("; the verification phase's wall time, median over repeats; picks against exact's on the same "
              "candidates, P(Yes) per candidate against exact's:" if grader
              else "; each agent's TTFT median, and its outputs identical to exact's, in chain order:"), ""]
    if grader:
        out += ["| dataset | mode | wall s | x exact | TTFT median s | TTFT p90 s | TTFT x exact | verify s "
                "| verify x exact | grader picks exact's | mean abs P(Yes) diff | accuracy |",
                "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    else:
        out += ["| dataset | mode | wall s | x exact | TTFT median s | TTFT p90 s | TTFT x exact | request latency "
                "median s | TTFT median per agent s | identical outputs per agent | accuracy |",
                "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in mine:
        head = (f"| {r['dataset']} | {r['mode']} | {r['wall_s']:.1f} | {_fmt(r.get('speedup_vs_exact'), '.2f')} "
                f"| {_fmt(r['ttft_median_s'], '.3f')} | {_fmt(r.get('ttft_p90_s'), '.3f')} "
                f"| {_fmt(r.get('ttft_median_vs_exact'), '.2f')} ")
        if grader:
            out.append(head + f"| {_fmt(r.get('verify_s'), '.1f')} | {_fmt(r.get('verify_time_vs_exact'), '.2f')} "
                              f"| {_fmt(r.get('grader_same_pick_vs_exact'), '.2f')} "
                              f"| {_fmt(r.get('grader_p_yes_abs_diff_vs_exact'), '.4f')} "
                              f"| {_fmt(r.get('accuracy'), '.2f')} |")
        else:
            out.append(head + f"| {_fmt(r.get('latency_median_s'), '.3f')} "
                              f"| {_per_agent(r.get('ttft_median_s_by_agent'), '.3f')} "
                              f"| {_per_agent(r.get('agent_output_identical_vs_exact'), '.2f')} "
                              f"| {_fmt(r.get('accuracy'), '.2f')} |")
    return out


AGENT_ROWS = {  # README summary: results file under benchmarks/results -> what the row calls it
    "agents/agents-steady.jsonl": "agents in steady state: planner, solver, critic, answer, each reading the earlier outputs",
    "agents-reading/agents-steady.jsonl": "reading agents in steady state: finder, drafter, checker, answer, each "
                                          "reading one passage after its persona and the earlier outputs",
    "agents/bon-grader-steady.jsonl": "best-of-4 judged by a grader persona, steady state, verification phase",
}


def summary_rows(results) -> list[list[str]]:
    """The agent workloads' README rows (``tables.summary``'s ``blend_extra``): blend against exact, with time to first token (and for the
    grader, the verification phase and its picks) beside wall time."""
    rows = []
    for file, what in AGENT_ROWS.items():
        path = results / file
        if not path.exists():
            continue
        row = _bench_row(f"{what}, {_scope(path)}", "ASKS blend (relay)", path, "asks-only")
        r = next(x for x in latest_rows(path) if x["mode"] == "asks-only")
        extra = f"TTFT median {r['ttft_median_s']:.3f} s ({_fmt(r.get('ttft_median_vs_exact'), '.2f')}x exact)"
        if "grader_picks" in r:
            extra += (f"; verification {_fmt(r.get('verify_time_vs_exact'), '.2f')}x exact; grader picks "
                      f"exact's candidate {_fmt(r.get('grader_same_pick_vs_exact'), '.2f')}")
        row[5] = f"{extra}; {row[5]}"
        rows.append(row)
    return rows
