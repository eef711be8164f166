"""The soak run's pure parts: its flag checks and its memory verdict."""

import pytest

from benchmarks.serving import soak


@pytest.mark.parametrize("argv, flag", [(["--duration-s", "0"], "--duration-s"), (["--clients", "0"], "--clients"),
                                        (["--warmup-s", "-1"], "--warmup-s"),
                                        (["--duration-s", "60", "--warmup-s", "60"], "--warmup-s (60.0) must be less"),
                                        (["--rss-growth-mb", "-5"], "--rss-growth-mb")])
def test_a_bad_value_names_its_flag(argv, flag, capsys):
    with pytest.raises(SystemExit) as exc:
        soak.parse_args(argv)
    assert exc.value.code == 2
    assert flag in capsys.readouterr().err


def samples(rss: list[float], every_s: float = 10.0) -> list[dict]:
    return [{"t_s": i * every_s, "rss_mb": r, "signature_bytes": 100 * i, "kv_in_use": i % 3} for i, r in enumerate(rss)]


def test_memory_growth_counts_only_after_warm_up():
    settings = soak.SoakSettings(duration_s=100, warmup_s=20, sample_every_s=10)
    verdict = soak.memory_verdict(samples([100, 500, 900, 900, 905, 903, 910]), settings)
    assert verdict["rss_after_warmup_mb"] == 900 and verdict["rss_max_after_warmup_mb"] == 910
    assert verdict["rss_growth_mb"] == 10
    assert verdict["signature_bytes_max"] == 600 and verdict["kv_in_use_max"] == 2


def test_a_steady_leak_shows_as_growth_and_slope():
    settings = soak.SoakSettings(duration_s=100, warmup_s=0, sample_every_s=10)
    verdict = soak.memory_verdict(samples([1000 + 2 * i for i in range(10)]), settings)  # 2 MB per 10 s
    assert verdict["rss_growth_mb"] == 18
    assert verdict["rss_slope_mb_per_h"] == pytest.approx(720, rel=1e-6)


def test_every_bad_request_of_the_mix_is_a_route_and_a_body():
    assert all(route.startswith("/") and isinstance(body, dict) for route, body in soak.BAD)
    assert set(soak.MIX) == {"program", "paraphrase", "adaptive", "walkaway", "bad"}
    assert all(callable(getattr(soak.Traffic, kind, None)) for kind in soak.MIX)  # each kind is an action


def test_growth_is_told_apart_by_process_and_by_anonymous_memory():
    settings = soak.SoakSettings(duration_s=100, warmup_s=10, sample_every_s=10)
    rows = samples([900, 1000, 1010, 1050])
    for i, row in enumerate(rows):  # the scheduler's heap grows 20 MB a sample, the server stays flat
        row["processes"] = {"server": {"rss_mb": 500.0, "anon_mb": 300.0},
                            "sglang::scheduler": {"rss_mb": 400.0 + 20 * i, "anon_mb": 100.0 + 20 * i}}
    growth = soak.memory_verdict(rows, settings)["growth_by_process_mb"]
    assert growth == {"server": {"rss_mb": 0.0, "anon_mb": 0.0}, "sglang::scheduler": {"rss_mb": 40.0, "anon_mb": 40.0}}


def test_the_memory_of_this_process_tree_is_read_per_process():
    import os

    total, processes = soak.process_tree_memory(os.getpid())
    assert total > 0 and processes["server"]["rss_mb"] > 0 and processes["server"]["anon_mb"] > 0
