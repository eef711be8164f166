"""``benchmarks.decode_profile``'s attribution of a trace's time to parts of the model, on a small
synthetic trace shaped like torch's profiler output (complete events, nested by time)."""

from __future__ import annotations

import gzip
import json

import pytest

from benchmarks.perf.decode_profile import part_of, self_times, summarize_trace


def ev(name: str, ts: float, dur: float, cat: str = "cpu_op") -> dict:
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "cat": cat, "pid": 1, "tid": 1}


def py(name: str, ts: float, dur: float) -> dict:
    return ev(name, ts, dur, cat="python_function")


STEP = [
    ev("step[DECODE bs=1]", 0, 100, cat="user_annotation"),
    py("sglang/srt/layers/layernorm.py(828): forward_native", 0, 10),
    ev("aten::mul", 2, 6),  # kernel time of the norm
    py("radix_ext/cpu/speed.py(120): _onednn_linear", 10, 40),
    ev("mkldnn::_linear_pointwise", 12, 30),
    py("sglang/srt/layers/logits_processor.py(300): forward", 50, 30),
    py("radix_ext/cpu/speed.py(120): _onednn_linear", 52, 25),  # the LM head's linear is ours too
    ev("mkldnn::_linear_pointwise", 55, 20),
    ev("aten::add", 200, 5),  # outside the step: not counted
]


def test_self_time_is_duration_less_children():
    own = {(e["name"], e["ts"]): t for e, t, _ in self_times(STEP)}
    assert own[("step[DECODE bs=1]", 0)] == 100 - 10 - 40 - 30
    assert own[("radix_ext/cpu/speed.py(120): _onednn_linear", 10)] == 10
    assert own[("mkldnn::_linear_pointwise", 12)] == 30


def test_the_lm_head_outranks_the_linear_frame_inside_it():
    parents = {id(e): p for e, _, p in self_times(STEP)}
    head_kernel = next(e for e in STEP if e["name"] == "mkldnn::_linear_pointwise" and e["ts"] == 55)
    layer_kernel = next(e for e in STEP if e["name"] == "mkldnn::_linear_pointwise" and e["ts"] == 12)
    assert part_of(head_kernel, parents[id(head_kernel)]) == "LM head"
    assert part_of(layer_kernel, parents[id(layer_kernel)]) == "linears"


def test_summary_per_step_by_part_and_kind(tmp_path):
    path = tmp_path / "t.trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": STEP}, f)
    out = summarize_trace(str(path))
    assert out["steps"] == 1 and out["step_ms"] == pytest.approx(0.1)
    parts = out["parts"]
    assert parts["linears"] == {"ops": pytest.approx(0.03), "python": pytest.approx(0.01)}
    assert parts["LM head"] == {"ops": pytest.approx(0.02), "python": pytest.approx(0.01)}
    assert parts["norms"] == {"ops": pytest.approx(0.006), "python": pytest.approx(0.004)}


def test_a_trace_without_decode_steps_is_refused(tmp_path):
    path = tmp_path / "t.trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": STEP[1:]}, f)
    with pytest.raises(RuntimeError, match="no step"):
        summarize_trace(str(path))


def test_the_lean_loops_rotation_counts_as_rotary_not_as_the_loop():
    loop = py("radix_ext/cpu/decode.py(180): _decode", 0, 50)
    rotate = py("radix_ext/cpu/decode.py(95): _rotate", 10, 8)
    kernel = ev("aten::mul", 11, 5)
    assert part_of(kernel, [rotate, loop]) == "rotary"
    assert part_of(ev("aten::add", 30, 5), [loop]) == "model (other)"


def test_the_fused_norm_and_rotation_of_the_int8_path_count_as_norms_and_rotary():
    loop = py("radix_ext/cpu/decode.py(180): _decode", 0, 100)
    norm = py("radix_ext/cpu/kernels.py(139): add_rms_norm", 10, 8)
    fused = py("radix_ext/cpu/kernels.py(181): fused_rms_norm", 9, 10)  # the norm's _forward_method
    rope = py("radix_ext/cpu/kernels.py(152): rope_neox", 40, 8)
    linear = py("radix_ext/cpu/kernels.py(127): linear", 60, 8)
    speed = py("radix_ext/cpu/speed.py(147): _onednn_linear", 59, 10)
    assert part_of(ev("rksc::add_rms_norm", 11, 5), [norm, fused, loop]) == "norms"
    assert part_of(ev("aten::empty", 9, 1), [fused, loop]) == "norms"  # its own Python's ops
    assert part_of(ev("rksc::rope_neox", 41, 5), [rope, loop]) == "rotary"
    assert part_of(ev("rksc::w8a16_linear", 61, 5), [linear, speed, loop]) == "linears"
