"""The docs' generated tables (``python -m benchmarks.report``: ``sections``, ``tables``) and the
figures (``python -m benchmarks.plot``), drawn from the committed results files."""
