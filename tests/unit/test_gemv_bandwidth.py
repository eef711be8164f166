"""The decode-bandwidth probe: one JSON line per measurement, each path computes the linear it
names, and bad flags are named at start."""

import json

import pytest
import torch
import torch.nn.functional as F

from benchmarks.perf import gemv_bandwidth
from radix_ext.cpu import kernels

PATHS = [p for p in gemv_bandwidth.PATHS if p != "int8" or kernels.unsupported() is None]


def test_prints_stream_and_each_path_per_thread_count(capsys):
    gemv_bandwidth.main(["--threads", "1", "--paths", ",".join(PATHS), "--matrices", "2",
                         "--stream-mb", "4", "--repeats", "1"])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["what"] for line in lines] == ["stream sum"] + [f"linear 1x576 @ 576x1536, {p}" for p in PATHS]
    assert all(line["threads"] == 1 and line["GB/s"] > 0 for line in lines)


@pytest.mark.parametrize("path", PATHS)
def test_each_path_computes_the_linear_and_counts_the_bytes_it_holds(path):
    torch.manual_seed(0)
    weight, x = torch.randn(64, 32), torch.randn(1, 32)
    packed, nbytes = gemv_bandwidth._packed(path, weight)
    dtype, call = gemv_bandwidth._call(path)
    out = call(x.to(dtype), packed).float()
    exact = F.linear(x, weight)
    assert (out - exact).abs().max() <= 0.02 * exact.abs().max()
    assert nbytes == {"float32": 64 * 32 * 4, "bfloat16": 64 * 32 * 2}.get(path.partition("-")[2], 64 * 32 + 64 * 4)


@pytest.mark.parametrize("argv, named", [(["--threads", "0"], "--threads"), (["--paths", "int4"], "int4"),
                                         (["--repeats", "0"], "--repeats"), (["--rows", "0"], "--rows")])
def test_bad_flags_fail_naming_them(argv, named, capsys):
    with pytest.raises(SystemExit):
        gemv_bandwidth.main(argv)
    assert named in capsys.readouterr().err
