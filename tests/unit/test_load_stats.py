"""The load command's pure parts: latency percentiles (nearest rank) and its flag checks."""

import pytest

from benchmarks.serving import load
from benchmarks.serving.load import percentiles


def test_nearest_rank_percentiles():
    samples = [float(i) for i in range(1, 101)]  # 1..100 s
    assert percentiles(samples) == {"p50": 50.0, "p95": 95.0, "p99": 99.0}
    assert percentiles([2.0]) == {"p50": 2.0, "p95": 2.0, "p99": 2.0}
    assert percentiles([]) == {"p50": None, "p95": None, "p99": None}


def test_bad_settings_are_refused_naming_the_flag(capsys):
    for argv, flag in ((["--programs", "0"], "--programs"), (["--pool-fraction", "0"], "--pool-fraction"),
                       (["--shots", "-1"], "--shots")):
        with pytest.raises(SystemExit) as exc:
            load.parse_args(argv)
        assert exc.value.code == 2
        assert flag in capsys.readouterr().err
