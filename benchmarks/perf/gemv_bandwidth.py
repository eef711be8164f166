"""``python -m benchmarks.gemv_bandwidth``: how fast decode-shaped linears read their weights,
against how fast this machine streams memory.

    python -m benchmarks.gemv_bandwidth --threads 1,2

A decode step multiplies one row per stream by every weight matrix, so its linears are bound by
how fast the weights come from memory. This prints, per thread count, the read bandwidth of a sum
over ``--stream-mb`` of memory, and per path (``--paths``) the bandwidth a 1 x 576 by 576 x 1,536
linear (SmolLM2-135M's MLP shape) reaches with its weights out of cache (``--matrices`` different
matrices, cycled): ``torch-*`` is ``F.linear``; ``onednn-*`` is oneDNN with the weight packed once,
what ``--cpu-linear-dtype float32`` / ``bfloat16`` decode runs (``radix_ext.cpu.speed``); ``int8``
is ``--cpu-linear-dtype int8``'s AVX-512 VNNI kernel (``radix_ext.cpu.kernels``; its bytes count the
scales), ``int8-amx`` the same weights packed with their AMX tiles' copy, which runs on the tiles
from 16 rows where the CPU has them (the same bits). ``--rows`` sets the input's rows (a batch of
decode streams, or a prefill); each line also gives the multiply-adds per second.
Medians of ``--repeats``; one JSON line per measurement.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

PATHS = ("torch-float32", "torch-bfloat16", "onednn-float32", "onednn-bfloat16", "int8", "int8-amx")


def _median_seconds(fn, repeats: int) -> float:
    fn()  # warm
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def stream_gbps(megabytes: int, repeats: int) -> float:
    """Read bandwidth of ``torch.sum`` over ``megabytes`` of float32, in GB/s."""
    x = torch.ones(megabytes * 1024 * 1024 // 4, dtype=torch.float32)
    return x.numel() * 4 / _median_seconds(x.sum, repeats) / 1e9


def _packed(path: str, weight: torch.Tensor) -> tuple[object, int]:
    """(what ``path`` multiplies by, the bytes it reads per pass)."""
    kind, _, dtype_name = path.partition("-")
    if kind == "int8":
        from radix_ext.cpu import kernels

        amx = dtype_name == "amx"
        packed = kernels.pack(weight, amx=amx)
        return packed, packed[0].numel() // (2 if amx else 1)  # a call reads one of the two copies
    w = weight.to(getattr(torch, dtype_name))
    nbytes = w.numel() * w.element_size()
    return (torch.ops.mkldnn._reorder_linear_weight(w, None) if kind == "onednn" else w), nbytes


def _call(path: str):
    kind, _, dtype_name = path.partition("-")
    if kind == "int8":
        from radix_ext.cpu import kernels

        return torch.float32, kernels.linear
    if kind == "onednn":
        return getattr(torch, dtype_name), lambda x, w: torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")
    return getattr(torch, dtype_name), F.linear


def gemv_gbps(path: str, matrices: int, repeats: int, rows: int = 1536, cols: int = 576,
              inputs: int = 1) -> tuple[float, float]:
    """(microseconds per linear, weight bytes read per second in GB/s) for an inputs x cols input
    against ``matrices`` different rows x cols weights, each read once per pass, on ``path``
    (``PATHS``)."""
    packed = [_packed(path, torch.randn(rows, cols)) for _ in range(matrices)]
    dtype, call = _call(path)
    x = torch.randn(inputs, cols).to(dtype)

    def one_pass() -> None:
        for w, _ in packed:
            call(x, w)

    per_linear = _median_seconds(one_pass, repeats) / matrices
    return per_linear * 1e6, packed[0][1] / per_linear / 1e9


def _csv(kind, choices=None):
    def parse(text: str) -> list:
        values = [kind(v) for v in text.split(",") if v]
        bad = [v for v in values if choices is not None and v not in choices]
        if not values or bad:
            raise argparse.ArgumentTypeError(f"{text!r}: expected a comma-separated list"
                                             + (f" from {', '.join(choices)}" if choices else ""))
        return values
    return parse


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gemv_bandwidth", description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=_csv(int), default=[1, 2], help="torch thread counts, comma-separated")
    p.add_argument("--paths", type=_csv(str, PATHS), default=list(PATHS),
                   help=f"linears to time, comma-separated, of {', '.join(PATHS)} (default: all)")
    p.add_argument("--matrices", type=int, default=200, help="different weight matrices cycled (more than the caches hold)")
    p.add_argument("--stream-mb", type=int, default=512, help="memory summed for the stream bandwidth")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--rows", type=int, default=1, help="the input's rows (default: %(default)s, one decode stream)")
    args = p.parse_args(argv)
    for name in ("matrices", "stream_mb", "repeats", "rows"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if min(args.threads) < 1:
        p.error(f"--threads must be >= 1, got {min(args.threads)}")
    for threads in args.threads:
        torch.set_num_threads(threads)
        print(json.dumps({"threads": threads, "what": "stream sum", "GB/s": round(stream_gbps(args.stream_mb, args.repeats), 1)}))
        for path in args.paths:
            micros, gbps = gemv_gbps(path, args.matrices, args.repeats, inputs=args.rows)
            print(json.dumps({"threads": threads, "what": f"linear {args.rows}x576 @ 576x1536, {path}",
                              "us": round(micros), "GB/s": round(gbps, 1),
                              "GMAC/s": round(args.rows * 576 * 1536 / micros / 1e3, 1)}))


if __name__ == "__main__":
    main()
