"""The linears an engine started with the defaults runs, for tests that bound numbers by them.

With int8 linears (the default on a VNNI CPU, ``rksc_sgl.config.default_cpu_linear_dtype``) each
linear rounds its input row to int16 at the row's own scale. That turns a float32 rounding
difference upstream (a 2-row decode step against a 1-row one, a KV reused rather than recomputed)
into whole rounding steps, which grow through the layers: log-probabilities 6.2e-4 apart where
float32 linears keep 1e-4, a sampled text parting late, the runtime's hidden states further from a
float32 calibration. Tests that compare across such a difference pick their bound with this.
"""

from rksc_sgl.config import RkscConfig

FLOAT32_LINEARS = RkscConfig().cpu_linear_dtype == "float32"
