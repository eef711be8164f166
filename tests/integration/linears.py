"""The numbers an engine started with the defaults computes, for tests that bound them.

With int8 linears (the default on a VNNI CPU, ``rksc_sgl.config.default_cpu_linear_dtype``) and
the invariant attention that comes with them (``radix_ext.cpu.attention``), every part of a
token's forward pass is row-invariant: a 2-row decode step computes each row's bits as a 1-row one
does, and a KV reused from the cache is the one a recomputation would write. ``ROW_INVARIANT``
tests compare such passes for equality. With float32 linears, oneDNN's and MKL's sums depend on the
batch's row count (log-probabilities within 1e-4). With int8 linears and SDPA's attention
(``RKSC_CPU_INVARIANT_ATTENTION=0``), each linear rounds its input row to int16 at the row's own
scale, which turns SDPA's float32 rounding differences into whole rounding steps: 6.2e-4 was seen,
and a sampled text can part late.
"""

from radix_ext.cpu.attention import invariant_attention
from rksc_sgl.config import RkscConfig

FLOAT32_LINEARS = RkscConfig().cpu_linear_dtype == "float32"
ROW_INVARIANT = RkscConfig().cpu_linear_dtype == "int8" and invariant_attention()
