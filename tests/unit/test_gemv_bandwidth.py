"""The decode-bandwidth probe: one JSON line per measurement, and bad flags named at start."""

import json

import pytest

from benchmarks.perf import gemv_bandwidth


def test_prints_stream_and_each_dtype_per_thread_count(capsys):
    gemv_bandwidth.main(["--threads", "1", "--dtypes", "float32,bfloat16", "--matrices", "2",
                         "--stream-mb", "4", "--repeats", "1"])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["what"] for line in lines] == ["stream sum", "linear 1x576 @ 576x1536, float32",
                                                 "linear 1x576 @ 576x1536, bfloat16"]
    assert all(line["threads"] == 1 and line["GB/s"] > 0 for line in lines)


def test_bandwidth_is_weight_bytes_over_time():
    micros, gbps = gemv_bandwidth.gemv_gbps(gemv_bandwidth.DTYPES["bfloat16"], matrices=2, repeats=1)
    assert gbps == pytest.approx(1536 * 576 * 2 / (micros / 1e6) / 1e9, rel=1e-2)


@pytest.mark.parametrize("argv, named", [(["--threads", "0"], "--threads"), (["--dtypes", "int4"], "int4"),
                                         (["--repeats", "0"], "--repeats")])
def test_bad_flags_fail_naming_them(argv, named, capsys):
    with pytest.raises(SystemExit):
        gemv_bandwidth.main(argv)
    assert named in capsys.readouterr().err
