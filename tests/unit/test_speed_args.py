"""``benchmarks.speed``: its start-up checks (llama.cpp is tried in a child process before any engine
starts, so a build this CPU cannot run is named instead of killing the run (SIGILL) mid-way), its
baselines, and what its decode rate counts."""

from __future__ import annotations

import pytest

from benchmarks.perf import speed


@pytest.mark.parametrize("probe,why", [
    ("import os, signal; os.kill(os.getpid(), signal.SIGILL)", "died of SIGILL"),
    ("raise ModuleNotFoundError(\"No module named 'llama_cpp'\")", "not installed (make llamacpp"),
    ("raise RuntimeError('no GGUF here')", "failed: RuntimeError: no GGUF here"),
])
def test_a_llama_cpp_that_cannot_run_is_named(monkeypatch, probe, why):
    monkeypatch.setattr(speed, "LLAMA_PROBE", probe)
    assert why in speed.llama_cpp_unusable()


def test_a_llama_cpp_that_runs_passes(monkeypatch):
    monkeypatch.setattr(speed, "LLAMA_PROBE", "pass")
    assert speed.llama_cpp_unusable() is None


def test_the_flag_fails_at_start_up_naming_it(monkeypatch, capsys):
    monkeypatch.setattr(speed, "LLAMA_PROBE", "import os, signal; os.kill(os.getpid(), signal.SIGILL)")
    monkeypatch.setattr(speed, "run_dtype", lambda *a: pytest.fail("an engine started"))
    with pytest.raises(SystemExit) as exit_:
        speed.main(["--llama-cpp", "--output", "/dev/null"])
    assert exit_.value.code == 2 and "--llama-cpp: llama.cpp died of SIGILL" in capsys.readouterr().err


@pytest.mark.parametrize("dtype", ["int8", "bfloat16"])
def test_the_float32_baseline_runs_float32_linears_whatever_the_default(dtype):
    # RkscConfig()'s default is int8 on a VNNI CPU: a baseline left to it timed int8 against int8.
    named = speed.engine_overrides(dtype)
    linears = {name: overrides["rksc"].cpu_linear_dtype for name, overrides in named.items() if name != "stock"}
    assert linears == {"ours": dtype, "unseeded": dtype, "float32": "float32"}
    assert named["stock"]["attention_backend"] == "torch_native"


def test_decode_excludes_the_prompt_and_the_round_trip_as_llama_cpps_does(monkeypatch):
    # A simulated engine on a simulated clock: each call costs a fixed 50 ms (the prompt, the first
    # token, the round trip) and 10 ms per later token of each stream's step.
    clock = [0.0]

    class Engine:
        def generate(self, prompt, sampling_params):
            steps = sampling_params[0]["max_new_tokens"] - 1
            clock[0] += 0.050 + 0.010 * steps
            return [{"meta_info": {"completion_tokens": p["max_new_tokens"]}} for p in sampling_params]

    monkeypatch.setattr(speed.time, "perf_counter", lambda: clock[0])
    assert speed.measure_decode(Engine(), 4, 64) == pytest.approx(4 / 0.010)  # 400 tok/s, not 256 / 0.68 s

    class Stalled(Engine):
        def generate(self, prompt, sampling_params):
            return super().generate(prompt, [{"max_new_tokens": 1}] * len(sampling_params))

    with pytest.raises(RuntimeError, match="decode: 4 tokens"):
        speed.measure_decode(Stalled(), 4, 64)
