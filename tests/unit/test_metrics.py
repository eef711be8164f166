"""``radix_ext.ops.metrics``: our totals become Prometheus counters, published as deltas."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from prometheus_client import REGISTRY

from radix_ext.ops import metrics
from radix_ext.asks.decision import Counters
from radix_ext.asks.blend import BlendCounters


def value(name: str, **labels) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


@pytest.fixture
def scheduler(monkeypatch):
    """A scheduler as ``publish`` sees it: server args and a tree cache with our totals."""
    monkeypatch.setattr(metrics, "EVICTED_TOKENS", metrics.collections.Counter())
    monkeypatch.setattr(metrics, "EXIT_ROWS", metrics.collections.Counter())
    if metrics._series is not None:  # series are process-wide; forget what earlier tests published
        metrics._series.published.clear()
    cache = SimpleNamespace(score_reports=0, asks=SimpleNamespace(counters=Counters(), blend_counters=BlendCounters()))
    return SimpleNamespace(server_args=SimpleNamespace(enable_metrics=True), tree_cache=cache)


def test_totals_are_published_once_as_counter_increments(scheduler):
    before = {k: value(f"rksc_{k}_total") for k in ("asks_reused_tokens", "rsbcm_score_reports")}
    adopted = value("rksc_asks_decisions_total", outcome="adopted")
    scored = value("rksc_evicted_tokens_total", node="scored")
    exits = value("rksc_early_exit_rows_total", exit_layer="12")
    counters = scheduler.tree_cache.asks.counters
    counters.adopted, counters.reused_tokens, counters.signature_bytes = 2, 300, 4096
    scheduler.tree_cache.score_reports = 5
    metrics.EVICTED_TOKENS["scored"] += 7
    metrics.EXIT_ROWS[12] += 3
    for _ in range(3):  # publishing again without news adds nothing
        metrics.publish(scheduler)
    assert value("rksc_asks_decisions_total", outcome="adopted") == adopted + 2
    assert value("rksc_asks_reused_tokens_total") == before["asks_reused_tokens"] + 300
    assert value("rksc_rsbcm_score_reports_total") == before["rsbcm_score_reports"] + 5
    assert value("rksc_asks_signature_bytes") == 4096
    assert value("rksc_evicted_tokens_total", node="scored") == scored + 7
    blend = scheduler.tree_cache.asks.blend_counters
    blended = value("rksc_asks_blend_requests_total", outcome="blended")
    reused = value("rksc_asks_blend_tokens_total", kind="reused")
    blend.blended, blend.reused_tokens = 4, 900
    metrics.publish(scheduler)
    metrics.publish(scheduler)
    assert value("rksc_asks_blend_requests_total", outcome="blended") == blended + 4
    assert value("rksc_asks_blend_tokens_total", kind="reused") == reused + 900
    assert value("rksc_early_exit_rows_total", exit_layer="12") == exits + 3


def test_a_total_reset_by_a_flush_counts_on_from_zero(scheduler):
    scheduler.tree_cache.score_reports = 4
    metrics.publish(scheduler)
    start = value("rksc_rsbcm_score_reports_total")
    scheduler.tree_cache.score_reports = 1  # flush_cache reset it, then one more report
    metrics.publish(scheduler)
    assert value("rksc_rsbcm_score_reports_total") == start + 1


def test_nothing_is_published_with_metrics_off(scheduler):
    scheduler.server_args.enable_metrics = False
    scheduler.tree_cache.score_reports = 1000
    start = value("rksc_rsbcm_score_reports_total")
    metrics.publish(scheduler)
    assert value("rksc_rsbcm_score_reports_total") == start


def test_stock_caches_without_our_attributes_publish_what_exists(scheduler):
    scheduler.tree_cache = SimpleNamespace()  # e.g. SGLang's own radix cache
    start = value("rksc_evicted_tokens_total", node="unscored")
    metrics.EVICTED_TOKENS["unscored"] += 2
    metrics.publish(scheduler)
    assert value("rksc_evicted_tokens_total", node="unscored") == start + 2


def test_hooks_publish_at_most_once_per_interval(scheduler, monkeypatch):
    calls = []
    monkeypatch.setattr(metrics, "publish", calls.append)
    monkeypatch.setattr(metrics, "_last_publish", [float("-inf")])
    for _ in range(100):  # a burst of decode steps and idle polls
        assert metrics._after("result", scheduler) == "result"
    assert calls == [scheduler]
    metrics._last_publish[0] -= metrics.PUBLISH_INTERVAL_S
    metrics._after(None, scheduler)
    assert len(calls) == 2
