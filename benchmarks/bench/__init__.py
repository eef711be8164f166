"""The paper's table, ``python -m benchmarks.bench``: every mode of a workload in one run (``run``), the
modes and workloads it runs, the statistics and records of its rows, the stop rules replayed on
its branches, and the two mechanisms measured on their own (``bon_verify``, ``rsbcm_compare``)."""
