"""The harness that measures the reasoning programs of ``programs/``, one folder per kind of
measurement, beside the results files they write (``results/``): ``bench/`` (the paper's table:
modes, workloads, statistics, records), ``serving/`` (one server or a cluster under load, faults,
unfair clients, routing policies), ``calibration/`` (CGEE's thresholds, ASKS's gate and what
approximate KV does to outputs), ``perf/`` (throughput and where the scheduler's time goes) and
``report/`` (the docs' generated tables and the figures).

Every tool keeps its command, ``python -m benchmarks.<tool>``, as the docs and the results files
record it: the folders below are searched for ``benchmarks.<tool>`` too. Code imports a tool by
its folder (``benchmarks.serving.load``; ``tests/unit/test_import_graph.py`` holds that)."""

from pathlib import Path

__path__ += [str(Path(__file__).parent / folder) for folder in ("bench", "serving", "calibration", "perf", "report")]
