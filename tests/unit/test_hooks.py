"""``radix_ext.hooks.around``: our AROUND hooks on one SGLang target run through one dispatcher,
in registration order (the first innermost), and the loaded plugin leaves one AROUND hook per
target, so SGLang's start-up warning about several never fires."""

from __future__ import annotations

import json
import subprocess
import sys

from radix_ext import hooks


def test_hooks_chain_innermost_first_and_a_hook_that_answers_skips_only_the_inner_ones(monkeypatch):
    registered = []
    monkeypatch.setattr(hooks, "_chains", {})
    monkeypatch.setattr("sglang.srt.plugins.hook_registry.HookRegistry.register",
                        lambda target, fn, kind: registered.append((target, fn, kind)))
    calls = []

    def inner(original, x):
        calls.append("inner")
        return original(x) + 1

    def outer(original, x):
        calls.append("outer")
        return "outer answered" if x < 0 else original(x) * 10

    hooks.around("pkg.f", inner)
    hooks.around("pkg.f", outer)
    hooks.around("pkg.f", inner)  # again: no-op
    [(target, dispatch, kind)] = registered
    assert target == "pkg.f" and kind.value == "around"
    assert dispatch(lambda x: x, 2) == 30 and calls == ["outer", "inner"]
    calls.clear()
    assert dispatch(lambda x: x, -1) == "outer answered" and calls == ["outer"]


def test_the_chain_is_composed_once_per_original_and_again_when_a_hook_joins(monkeypatch):
    import functools
    import types

    registered, built = [], []
    monkeypatch.setattr(hooks, "_chains", {})
    monkeypatch.setattr("sglang.srt.plugins.hook_registry.HookRegistry.register",
                        lambda target, fn, kind: registered.append(fn))
    monkeypatch.setattr(hooks, "functools", types.SimpleNamespace(
        partial=lambda *a: built.append(a[0]) or functools.partial(*a)))

    def plus_one(original, x):
        return original(x) + 1

    def double(original, x):
        return original(x) * 2

    def f(x):
        return x

    hooks.around("pkg.g", plus_one)
    [dispatch] = registered
    assert [dispatch(f, 1), dispatch(f, 2)] == [2, 3] and built == [plus_one]
    hooks.around("pkg.g", double)
    assert dispatch(f, 1) == 4 and built == [plus_one, plus_one, double]
    assert dispatch(lambda x: -x, 1) == 0 and len(built) == 5  # another original: composed anew


def test_the_loaded_plugin_leaves_one_around_hook_per_target():
    """In a fresh interpreter (registration is process-wide): ``radix_ext.plugin.load()`` with
    every mechanism that registers an AROUND hook on, then SGLang's registry."""
    script = (
        "import json\n"
        "from radix_ext import plugin\n"
        "from sglang.srt.plugins.hook_registry import HookRegistry, HookType\n"
        "plugin.load()\n"
        "counts = {t: sum(ht == HookType.AROUND for ht, _, _ in hs) for t, hs in HookRegistry._hooks.items()}\n"
        "print(json.dumps(counts))\n"
    )
    env = {"RKSC_SGL_CONFIG": json.dumps({"asks": True, "rsbcm": True})}
    import os

    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                         env={**os.environ, **env}, check=True).stdout
    counts = json.loads(out.strip().splitlines()[-1])
    forward = "sglang.srt.models.llama.LlamaForCausalLM.forward"
    assert counts[forward] == 1 and counts["sglang.srt.managers.schedule_policy.PrefillAdder.add_one_req"] == 1
    assert max(counts.values()) == 1, {t: n for t, n in counts.items() if n > 1}
