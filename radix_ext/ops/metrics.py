"""Our scheduler-side counters in SGLang's Prometheus ``/metrics`` (with ``--enable-metrics``).

SGLang runs prometheus_client in multiprocess mode: every process writes its series to files
under ``PROMETHEUS_MULTIPROC_DIR`` (set before the scheduler is spawned) and the HTTP server's
``/metrics`` merges them. What we count lives in the scheduler process (the radix tree, ASKS's
decisions, early exit), so AFTER hooks on ``Scheduler.process_batch_result`` (every batch) and
``Scheduler.on_idle`` (the idle loop, polled continuously) publish what changed, at most every
``PUBLISH_INTERVAL_S``; with metrics off they return at once. The series (counters end in ``_total``):

* ``rksc_asks_decisions_total{outcome}``: adopted, gate (rejected), no_donor, no_span, skipped;
* ``rksc_asks_reused_tokens_total``: prompt tokens served from a donor's KV;
* ``rksc_asks_signature_bytes``: signature bytes the tree holds (gauge);
* ``rksc_asks_blend_requests_total{outcome}``: blend's requests, ``blended``, ``no_donor`` or ``full``
  (had donors, computed every token);
* ``rksc_asks_blend_tokens_total{kind}``: tokens a donor covered, ``reused`` (its KV taken) or
  ``recomputed`` (selected and computed anyway), and ``kept``: blended requests' tails kept as
  their group's private donors (``radix_ext.asks.private``);
* ``rksc_rsbcm_score_reports_total``: requests that reported a branch score;
* ``rksc_evicted_tokens_total{node}``: evicted tokens, ``scored`` (RSBCM ranked them by a
  reported score) or ``unscored`` (plain recency);
* ``rksc_early_exit_rows_total{exit_layer}``: CGEE verification rows by the layer they stopped
  after (the model's depth when they ran every layer).

CGEE's skip decisions are taken by the client before any request is sent; the server never sees
them, so they are in the program's results (``benchmarks``), not here.
"""

from __future__ import annotations

import collections
import time
from typing import Any

PROCESS_BATCH_RESULT = "sglang.srt.managers.scheduler.Scheduler.process_batch_result"
ON_IDLE = "sglang.srt.managers.scheduler.Scheduler.on_idle"
PUBLISH_INTERVAL_S = 0.5

# Tallies kept by the mechanisms themselves (whether or not metrics are on), read by ``publish``.
EVICTED_TOKENS: collections.Counter = collections.Counter()  # "scored" / "unscored" -> tokens
EXIT_ROWS: collections.Counter = collections.Counter()  # exit layer -> flagged rows

ASKS_OUTCOMES = {"adopted": "adopted", "gate": "rejected_by_gate", "no_donor": "no_donor",
                 "no_span": "no_span", "skipped": "skipped"}


class _Series:
    """The Prometheus objects (created once, in the scheduler, after the multiprocess dir is set)
    and the totals already published."""

    def __init__(self) -> None:
        from prometheus_client import Counter, Gauge

        self.asks_decisions = Counter("rksc_asks_decisions", "ASKS decisions by outcome", ["outcome"])
        self.asks_reused = Counter("rksc_asks_reused_tokens", "Prompt tokens ASKS served from a donor's KV")
        self.asks_bytes = Gauge("rksc_asks_signature_bytes", "ASKS signature bytes held by the radix tree",
                                multiprocess_mode="livesum")
        self.blend_requests = Counter("rksc_asks_blend_requests", "ASKS blend requests by outcome", ["outcome"])
        self.blend_tokens = Counter("rksc_asks_blend_tokens", "Blend tokens: donor-covered (reused, recomputed) or tails kept",
                                    ["kind"])
        self.score_reports = Counter("rksc_rsbcm_score_reports", "Requests that reported a branch score")
        self.evicted = Counter("rksc_evicted_tokens", "Evicted radix-tree tokens by node kind", ["node"])
        self.exit_rows = Counter("rksc_early_exit_rows", "CGEE verification rows by exit layer", ["exit_layer"])
        self.published: dict[tuple, float] = collections.defaultdict(float)

    def advance(self, counter, key: tuple, total: float, **labels) -> None:
        """Increase ``counter`` (labelled ``labels``) by what ``total`` grew since the last call;
        a total that went down (a cache flush reset it) starts counting again from zero."""
        done = self.published[key]
        delta = total - done if total >= done else total
        if delta > 0:
            (counter.labels(**labels) if labels else counter).inc(delta)
        self.published[key] = total


_series: _Series | None = None
_last_publish = [float("-inf")]  # time.monotonic() of the last publish from a hook


def snapshot(cache) -> dict[tuple, float]:
    """Every total ``publish`` exports, keyed ``(series, label)``."""
    out: dict[tuple, float] = {("evicted", kind): float(n) for kind, n in EVICTED_TOKENS.items()}
    out.update({("exit_rows", str(layer)): float(n) for layer, n in EXIT_ROWS.items()})
    out[("score_reports", "")] = float(getattr(cache, "score_reports", 0))
    asks = getattr(cache, "asks", None)
    if asks is not None:
        counters = asks.counters
        out.update({("asks_decisions", outcome): float(getattr(counters, field))
                    for outcome, field in ASKS_OUTCOMES.items()})
        out[("asks_reused", "")] = float(counters.reused_tokens)
        out[("asks_bytes", "")] = float(counters.signature_bytes)
        blend = asks.blend_counters
        out.update({("blend_requests", outcome): float(getattr(blend, outcome))
                    for outcome in ("blended", "no_donor", "full")})
        out[("blend_tokens", "reused")] = float(blend.reused_tokens)
        out[("blend_tokens", "recomputed")] = float(blend.recomputed_tokens)
        out[("blend_tokens", "kept")] = float(blend.kept_tokens)
    return out


def publish(scheduler) -> None:
    """Bring the Prometheus series up to date with this scheduler's totals."""
    global _series
    if not getattr(scheduler.server_args, "enable_metrics", False):
        return
    if _series is None:
        _series = _Series()
    labels = {"asks_decisions": "outcome", "evicted": "node", "exit_rows": "exit_layer",
              "blend_requests": "outcome", "blend_tokens": "kind"}
    for (name, label), total in snapshot(scheduler.tree_cache).items():
        metric = getattr(_series, name)
        if name == "asks_bytes":
            metric.set(total)
        elif name in labels:
            _series.advance(metric, (name, label), total, **{labels[name]: label})
        else:
            _series.advance(metric, (name, label), total)


def _after(result: Any, scheduler, *args, **kwargs):
    now = time.monotonic()
    if now - _last_publish[0] >= PUBLISH_INTERVAL_S:
        _last_publish[0] = now
        publish(scheduler)
    return result


def install() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    for target in (PROCESS_BATCH_RESULT, ON_IDLE):
        HookRegistry.register(target, _after, HookType.AFTER)
