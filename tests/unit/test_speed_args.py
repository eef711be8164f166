"""``benchmarks.speed``'s start-up checks: llama.cpp is tried in a child process before any engine
starts, so a build this CPU cannot run is named instead of killing the run (SIGILL) mid-way."""

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
