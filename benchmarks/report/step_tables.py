"""The decode step's generated table beside ``decode_profile``'s (``tables.decode_profile_section``):
``benchmarks.decode_parts``'s, what one call of the decoder layers spends, kernel by kernel."""

from __future__ import annotations

from pathlib import Path

from benchmarks.perf.decode_parts import PARTS
from benchmarks.report.tables import latest_rows, markdown


def decode_parts_section(path: Path) -> str:
    """The latest run: a column per stream count, a row per part (ms per call), the call and what
    is left of it, then the LM head after it."""
    rows = sorted(latest_rows(path), key=lambda r: r["streams"])
    first = rows[0]
    body = [["the call", *(f"{r['call_ms']:.2f}" for r in rows)],
            *([part, *(f"{r['parts_ms'][part]:.2f}" for r in rows)] for part in PARTS),
            ["rest (the loop around them)", *(f"{r['rest_ms']:.2f}" for r in rows)],
            ["LM head, after the call", *(f"{r['lm_head_ms']:.2f}" for r in rows)]]
    return (f"Commit {first['commit']}, {first['date']}, {first['machine']}, {first['threads']} threads, "
            f"{first['context']} positions per row, medians. Produced by:\n\n```bash\n{first['command']}\n```\n\n"
            + markdown(["ms", *(f"{r['streams']} stream{'s' * (r['streams'] > 1)}" for r in rows)], body))
