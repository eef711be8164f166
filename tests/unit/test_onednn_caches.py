"""The oneDNN primitive caches are capped in every process that loads our plugin
(``radix_ext.cpu.speed.cap_onednn_caches``): a linear of every row count a server's forwards bring
must not leave a primitive each behind."""

from __future__ import annotations

import ast
import inspect
import json
import os
import subprocess
import sys
import textwrap

from radix_ext.cpu import speed as cpu_speed

# A fresh interpreter (each library reads its capacity once), oneDNN linears of SmolLM2-135M's
# four shapes at every row count 1..256 (~1,000 primitives), RssAnon growth in MB after a trim.
PROBE = textwrap.dedent("""
    import ctypes, json, sys
    if sys.argv[1] == "capped":
        from radix_ext.cpu.speed import cap_onednn_caches
        cap_onednn_caches()
    import torch

    def anon_mb():
        with open("/proc/self/status") as status:
            return next(int(l.split()[1]) / 1024 for l in status if l.startswith("RssAnon:"))

    torch.manual_seed(0)
    linears = [(torch.ops.mkldnn._reorder_linear_weight(torch.randn(o, i), None), i)
               for o, i in ((960, 576), (576, 576), (3072, 576), (576, 1536))]
    xs = {(m, i): torch.randn(m, i) for m in range(1, 257) for i in (576, 1536)}
    start = anon_mb()
    for m in range(1, 257):
        for w, i in linears:
            torch.ops.mkldnn._linear_pointwise(xs[m, i], w, None, "none", [], "")
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    print(json.dumps(anon_mb() - start))
""")


def growth_mb(mode: str) -> float:
    env = {k: v for k, v in os.environ.items() if k not in cpu_speed.ONEDNN_CACHE_ENVS}
    out = subprocess.run([sys.executable, "-c", PROBE, mode], env=env, capture_output=True, text=True,
                         timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_capped_caches_keep_a_linear_of_every_row_count_from_growing_the_process():
    capped, default = growth_mb("capped"), growth_mb("default")
    assert capped < 120, f"capped caches grew the process by {capped:.0f} MB"
    assert default > capped + 150, (default, capped)  # the growth the cap exists for is still there


def test_the_operators_own_capacity_wins(monkeypatch):
    monkeypatch.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "512")
    monkeypatch.delenv("LRU_CACHE_CAPACITY", raising=False)
    assert cpu_speed.cap_onednn_caches() == {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "512",
                                             "LRU_CACHE_CAPACITY": str(cpu_speed.ONEDNN_CACHE_CAPACITY)}


def test_sglang_loads_plugins_first_thing_in_the_scheduler_process():
    """The cap is read when the first primitive is built: our plugin must load before the model."""
    from sglang.srt.managers import scheduler

    body = ast.parse(textwrap.dedent(inspect.getsource(scheduler.run_scheduler_process))).body[0].body
    assert isinstance(body[0], ast.Expr) and ast.unparse(body[0].value) == "load_plugins()"
