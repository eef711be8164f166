"""Calibrations and quality against exact: CGEE's thresholds (``calibrate_cgee``), ASKS's gate
(``calibrate_asks``) and what ASKS does to outputs (``asks_quality``, ``blend_quality``)."""
