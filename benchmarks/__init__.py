"""The harness that measures the reasoning programs of ``programs/``: the paper's table
(``bench``), throughput (``speed``), CGEE calibration and verification measurements, RSBCM's
eviction comparison, and the README's results sections (``report``, ``plot``), beside the
results files they write (``results/``)."""
