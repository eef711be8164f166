"""``benchmarks.decode_parts``: the one call timed beside its kernels on a tiny stack, and its
start-up checks."""

from __future__ import annotations

import pytest

from benchmarks.perf import decode_parts
from benchmarks.report.step_tables import decode_parts_section
from tests.unit.test_decode_stack import needs_kernels

TINY = {"layers": 2, "hidden": 64, "q_heads": 2, "kv_heads": 1, "head_dim": 32, "inter": 96, "vocab": 100,
        "eps": 1e-5}


@needs_kernels
def test_every_part_is_timed_and_the_rest_is_the_call_less_them(tmp_path):
    row = decode_parts.measure(TINY, streams=3, context=20, repeats=2)
    assert set(row["parts_ms"]) == set(decode_parts.PARTS)
    assert all(ms > 0 for ms in (*row["parts_ms"].values(), row["call_ms"], row["lm_head_ms"]))
    assert row["rest_ms"] == pytest.approx(row["call_ms"] - sum(row["parts_ms"].values()), abs=2e-3)
    path = tmp_path / "parts.jsonl"
    meta = {"commit": "abc1234", "date": "2026-12-08", "machine": "here", "threads": 2, "command": "cmd"}
    decode_parts.append_jsonl(path, [{**row, **meta}, {**row, "streams": 1, **meta}])
    table = decode_parts_section(path)
    assert "| ms | 1 stream | 3 streams |" in table and "| K/V writes |" in table and "20 positions" in table


@pytest.mark.parametrize("args,message", [(["--streams", "1,x"], "--streams takes"),
                                          (["--context", "0"], "must be >= 1"),
                                          (["--model-path", "/no/such/folder"], "not an existing local folder")])
def test_bad_arguments_fail_at_start_up_naming_them(args, message, capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_:
        decode_parts.main([*args, "--output", str(tmp_path / "out.jsonl")])
    assert exit_.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "out.jsonl").exists()
