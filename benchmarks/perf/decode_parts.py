"""``python -m benchmarks.decode_parts``: what one call of the decoder layers spends, kernel by kernel.

    python -m benchmarks.decode_parts --streams 1,8,32 --context 100

With int8 linears a decode step runs every decoder layer in one C++ call
(``radix_ext.cpu.kernels.decode_layers``), which SGLang's profiler (``benchmarks.decode_profile``)
sees as one op. This times the call on the served model's shapes (its ``config.json``; weights
random, packed as at load: the kernels' time does not depend on the values), each of
``--streams`` rows at ``--context`` positions, then each kind of kernel the call runs, alone, as
many times as the call runs it: the linears (qkv, o, gate_up, down of every layer), the attention,
the fused norms, the rotations, the activation (SGLang's ``silu(g) * u``, as the call does it) and
the K/V writes into the pool. "rest" is the call less those parts: what the loop around them costs
(allocations, dispatch, thread start-up), negative within the noise when there is none. The LM
head, a linear of the vocabulary's width after the call, is timed the same way, beside it.
Medians of ``--repeats`` timings; one JSON line per stream count appended to ``--output``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from benchmarks.bench.records import MODEL_NAME, append_jsonl, git_commit, machine

RESULTS = Path("benchmarks/results/decode_parts.jsonl")
PARTS = ("linears", "attention", "norms", "rotations", "activation", "K/V writes")


def median_ms(fn, repeats: int) -> float:
    fn()  # warm
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def shapes(model_path: str) -> dict:
    config = json.loads((Path(model_path) / "config.json").read_text())
    heads = config["num_attention_heads"]
    return {"layers": config["num_hidden_layers"], "hidden": config["hidden_size"], "q_heads": heads,
            "kv_heads": config.get("num_key_value_heads", heads),
            "head_dim": config.get("head_dim") or config["hidden_size"] // heads,
            "inter": config["intermediate_size"], "vocab": config["vocab_size"], "eps": config["rms_norm_eps"]}


def measure(s: dict, streams: int, context: int, repeats: int) -> dict:
    """The call's ms and each part's, for ``streams`` rows at ``context`` positions each."""
    from radix_ext.cpu import kernels
    from radix_ext.cpu.attention import QueryRows

    ops, gen = kernels._ops(), torch.Generator().manual_seed(0)
    L, H, qh, kh, d, inter = s["layers"], s["hidden"], s["q_heads"], s["kv_heads"], s["head_dim"], s["inter"]
    widths = [(qh + 2 * kh) * d, H, 2 * inter, H] * L
    inputs = [H, qh * d, H, inter] * L
    linears = [kernels.pack(torch.randn(n, k, generator=gen) / k ** 0.5)[0] for n, k in zip(widths, inputs)]
    norms = [torch.rand(H, generator=gen) + 0.5 for _ in range(2 * L)]
    weights = kernels.LayerWeights(norms, [s["eps"]] * (2 * L), linears, widths, [d ** -0.5] * L, qh, kh, d)
    slots = streams * context + 1
    k_bufs = [torch.randn(slots, kh, d, generator=gen) for _ in range(L)]
    v_bufs = [torch.randn(slots, kh, d, generator=gen) for _ in range(L)]
    table = torch.arange(1, slots, dtype=torch.int32).view(streams, context).contiguous()
    rows = QueryRows.decode(torch.arange(streams), torch.full((streams,), context))
    loc = table[:, -1].long()
    cos, sin = (t.unsqueeze(-2).contiguous() for t in torch.randn(streams, d, generator=gen).chunk(2, dim=-1))
    hidden = torch.randn(streams, H, generator=gen)
    xs = {k: torch.randn(streams, k, generator=gen) for k in set(inputs)}
    q = torch.randn(streams, qh, d, generator=gen)
    qkv = torch.randn(streams, widths[0], generator=gen)
    g = torch.randn(streams, 2 * inter, generator=gen)
    kv = torch.randn(streams, kh, d, generator=gen)
    head = kernels.pack(torch.randn(s["vocab"], H, generator=gen) / H ** 0.5)[0]
    silu = torch.nn.functional.silu
    call = median_ms(lambda: kernels.decode_layers(hidden, weights, cos, sin, k_bufs, v_bufs, loc, table, rows),
                     repeats)
    parts = {
        "linears": lambda: [ops.w8a16_linear(xs[k], w, n, None) for w, n, k in zip(linears, widths, inputs)],
        "attention": lambda: [ops.causal_attention(q, k_bufs[i], v_bufs[i], table, rows.req_rows, rows.offsets,
                                                   rows.positions, d ** -0.5) for i in range(L)],
        "norms": lambda: [ops.add_rms_norm(hidden, hidden, norms[i], s["eps"]) for i in range(2 * L)],
        "rotations": lambda: [ops.rope_neox(qkv.narrow(1, 0, qh * d), qh, cos, sin) for _ in range(2 * L)],
        "activation": lambda: [(silu(g.narrow(1, 0, inter)) * g.narrow(1, inter, inter)).contiguous()
                               for _ in range(L)],
        "K/V writes": lambda: [buf.index_put_((loc,), kv) for buf in (*k_bufs, *v_bufs)],
    }
    ms = {name: round(median_ms(fn, repeats), 3) for name, fn in parts.items()}
    return {"streams": streams, "context": context, "call_ms": round(call, 3), "parts_ms": ms,
            "rest_ms": round(call - sum(ms.values()), 3),
            "lm_head_ms": round(median_ms(lambda: ops.w8a16_linear(hidden, head, s["vocab"], None), repeats), 3)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.decode_parts", description=__doc__.splitlines()[0])
    p.add_argument("--streams", default="1,8,32", help="comma-separated row counts (default: %(default)s)")
    p.add_argument("--context", type=int, default=100, help="positions each row attends to (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=21, help="timings per median (default: %(default)s)")
    p.add_argument("--model-path", default=None, help=f"local HF folder (default: {MODEL_NAME}'s)")
    p.add_argument("--output", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    try:
        streams = [int(x) for x in args.streams.split(",")]
    except ValueError:
        p.error(f"--streams takes comma-separated integers, got {args.streams!r}")
    if min(streams) < 1 or args.context < 1 or args.repeats < 1:
        p.error(f"--streams, --context and --repeats must be >= 1, got {streams}, {args.context}, {args.repeats}")
    from rksc_sgl.config import int8_linears_unsupported
    from rksc_sgl.model_cache import resolve_model_path

    try:
        s = shapes(resolve_model_path(args.model_path))
    except ValueError as e:
        p.error(str(e))
    if why := int8_linears_unsupported():
        p.error(f"the one call runs int8 linears, which cannot run here: {why}")
    meta = {"commit": git_commit(), "date": time.strftime("%Y-%m-%d"), "machine": machine(),
            "model": args.model_path or MODEL_NAME, "threads": torch.get_num_threads(),
            "command": "python -m benchmarks.decode_parts " + " ".join(argv if argv is not None else sys.argv[1:])}
    rows = [{**measure(s, n, args.context, args.repeats), **meta} for n in streams]
    append_jsonl(args.output, rows)
    print(f"{'streams':>7} {'call':>7} " + " ".join(f"{p:>10}" for p in PARTS) + f" {'rest':>7} {'LM head':>8}  (ms)")
    for r in rows:
        print(f"{r['streams']:>7} {r['call_ms']:>7.2f} " + " ".join(f"{r['parts_ms'][p]:>10.2f}" for p in PARTS)
              + f" {r['rest_ms']:>7.2f} {r['lm_head_ms']:>8.2f}")
    print(f"appended {len(rows)} lines to {args.output}")


if __name__ == "__main__":
    main()
