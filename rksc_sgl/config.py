"""rksc-sgl's options: one frozen dataclass, the single source of defaults for flags and engine.

The options travel to SGLang's spawned scheduler as JSON in the ``RKSC_SGL_CONFIG`` environment
variable (set by ``launch_engine`` / ``rksc_sgl.launch_server``, or by hand before
``python -m sglang.launch_server``), because spawn carries no Python state over.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import platform
import shutil
from pathlib import Path
from typing import Any

ENV_VAR = "RKSC_SGL_CONFIG"
POOLINGS = ("mean", "last")  # --asks-pooling
ASKS_MODES = ("blend", "adopt")  # --asks-mode
ASKS_SELECTORS = ("deviation", "leading")  # --asks-select
CPU_LINEAR_DTYPES = ("float32", "bfloat16", "int8")  # --cpu-linear-dtype (radix_ext.cpu.speed.LINEAR_DTYPES)
BACKEND_NAME = "rksc"
INT8_CPU_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni")  # radix_ext/cpu/kernels.cpp
ONEDNN_LINEARS_ENV = "RKSC_CPU_ONEDNN_LINEARS"  # "0": SGLang's F.linear, float32 only (radix_ext.cpu.speed)


def cache_dir() -> Path:
    """The user cache folder of rksc-sgl (not created here): ``$RKSC_SGL_CACHE``, else
    ``$XDG_CACHE_HOME/rksc-sgl``, else ``~/.cache/rksc-sgl``. The model and the CPU kernels live there."""
    if os.environ.get("RKSC_SGL_CACHE"):
        return Path(os.environ["RKSC_SGL_CACHE"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "rksc-sgl"


def cxx_compiler() -> str:
    return os.environ.get("CXX", "").strip() or "g++"


@functools.lru_cache(maxsize=1)
def _cpu_flags() -> frozenset[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return frozenset(line.partition(":")[2].split())


def int8_linears_unsupported() -> str | None:
    """Why ``--cpu-linear-dtype int8`` cannot run on this machine (None: it can): its kernels
    need x86-64 with AVX-512 VNNI and a C++ compiler to build them once."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return f"needs an x86-64 CPU (this is {platform.machine()})"
    missing = [flag for flag in INT8_CPU_FLAGS if flag not in _cpu_flags()]
    if missing:
        return f"the CPU lacks {', '.join(missing)}"
    if _which(cxx_compiler()) is None:
        return f"no C++ compiler {cxx_compiler()!r} on PATH (set CXX)"
    return None


@functools.lru_cache(maxsize=8)
def _which(program: str) -> str | None:
    return shutil.which(program)  # once per name and process: every RkscConfig() asks


def onednn_linears_off() -> bool:
    """``RKSC_CPU_ONEDNN_LINEARS=0`` (an ablation): every linear stays SGLang's float32 ``F.linear``."""
    return os.environ.get(ONEDNN_LINEARS_ENV, "1") == "0"


def default_cpu_linear_dtype() -> str:
    """``--cpu-linear-dtype``'s default: int8 where this machine runs its kernels, else float32
    (and float32 when ``RKSC_CPU_ONEDNN_LINEARS=0`` keeps SGLang's linears)."""
    return "float32" if onednn_linears_off() or int8_linears_unsupported() else "int8"


@dataclasses.dataclass(frozen=True)
class RkscConfig:
    """All mechanisms default to off: then SGLang runs as stock, but for seeded sampling."""

    rsbcm: bool = False  # eviction by branch_score / (depth + 1)
    # Seeded, batch-invariant sampling on SGLang's "pytorch" sampling backend (the CPU's):
    # a request's draws depend only on its logits, its sampling_seed (random if absent) and the
    # token position (radix_ext.sampling.sampler). Off: SGLang's own sampler, which drops seeds on CPU.
    seeded_sampling: bool = True
    # Diagnostics: each sampled token's Gumbel decision margin in meta_info (rksc_sample_margin).
    report_sampling_margins: bool = False
    # CGEE thresholds of a server (--cgee-*): what every client's verify() uses unless the program
    # passes its own (rksc_sgl.cgee; the server reports them in its internal state). Level 1 skips
    # verification when the winner's confidence >= tau_conf and beats the runner-up by the relative margin; level 2 exits at the
    # first layer >= min_layer with lens entropy < theta that moved < epsilon (nats). Values:
    # the pooled "thresholds" of benchmarks/results/cgee_thresholds.json, calibrated for
    # SmolLM2-135M with seeded sampling on 400 held-apart problems (the last 100 of each dataset),
    # their candidates sampled as the benchmark's table samples them (3 shots, 96 new tokens,
    # temperature 0.7), for a 5% bound on CGEE error (`python -m benchmarks.calibrate_cgee`, see its
    # docstring). Its logit lens decides like the full depth on at most 65% of problems before layer
    # 30, so the calibration switches level 2 off (min_layer = L = 30): recalibrate for another model.
    cgee_tau_conf: float = 0.4
    cgee_margin: float = 0.2
    cgee_theta: float = 0.1
    cgee_epsilon: float = 0.02
    cgee_min_layer: int = 30
    # ASKS (radix_ext.asks.decision): a request whose cached opening span means the same as a sibling span
    # of its own substitution group (docs/asks.md) adopts that span's tokens and reuses the KV
    # below it. Gate: weighted cosine of background-centred full hidden states of the span's last
    # token, weights exp(alpha * l / L) over the probed layers, sigma >= tau; tau >= 1 never
    # adopts. Defaults: benchmarks/results/asks_calibration.json (SmolLM2-135M). Chosen on
    # calibration families and same-topic calibration controls, that gate (tau 0.413) accepted
    # 5.6% of the held-out same-topic evaluation controls, over the 1% target; no signature of
    # this model reaches the target at a useful recall, so tau is the safe one, above every
    # control sigma seen (0.5956): 0 false accepts, 1 of 28 evaluation paraphrase pairs accepted.
    asks: bool = False
    asks_tau: float = 0.5956
    asks_alpha: float = 1.0
    asks_layers: str = "16-30"  # "all", or 1-based layer numbers and ranges: "10-30", "4,8,12"
    asks_min_tail: int = 16  # the donor's subtree must continue with >= this many of our tokens
    asks_signature_cap_mb: float = 64.0  # host memory for span signatures; capture stops beyond
    asks_background: str = "auto"  # "auto" (packaged for the model, if any), "none", or a .pt path
    # The most samples one request may ask for (sampling_params.n, OpenAI n): SGLang expands a
    # request into n queued children, so an unbounded n holds the queue (radix_ext.ops.request_guards).
    max_n: int = 64
    # The most generations one request may fan out to: prompts in a batch times n. SGLang queues
    # them all at once, so an unbounded batch list holds the server (radix_ext.ops.batch_guards).
    max_fanout: int = 256
    asks_pooling: str = "last"  # a span's signature: "mean" over its tokens, or its "last" token's state
    # ASKS's mode (docs/asks.md). "blend" (radix_ext.asks.blend): a request keeps every word; the
    # KV of its tokens that its group computed after another opening is reused, K re-rotated to
    # the request's positions, and a selected share of them recomputed. "adopt": the gate above
    # rewrites a branch's opening span to a sibling's wording (exact KV, changed prompt).
    asks_mode: str = "blend"
    # Blend: the share of reused tokens recomputed (0: none, 1.0: all, token-identical to exact),
    # chosen by "deviation" (CacheBlend: the first layers computed whole, then the tokens whose KV
    # deviates most from the donor's) or "leading" (EPIC: the first tokens of each reused
    # segment); the request's last asks_fresh_tail tokens (question, assistant header) always are.
    asks_recompute: float = 0.05
    asks_select: str = "deviation"
    asks_fresh_tail: int = 32
    # Blend's gate (selector "deviation", share strictly between 0 and 1): every reused token whose
    # KV at the check layer stands further than this from the request's own (relative L2 of V or
    # of K) is recomputed too, beyond the share; "inf" turns the gate off.
    asks_max_deviation: float = 0.025
    # Blend's check (selector "deviation"): the first layers computed for every token before the
    # selection, the last of them only as far as its K and V, which are compared with the donor's.
    # >= 2: layer 1's K and V are projections of each token's own embedding, the same after any
    # context (radix_ext.asks.selection gives the measurements behind 2).
    asks_check_layers: int = 2
    # Blend's relay: a finished blended request's approximate tail (its prompt after its exact part,
    # and its output) stays in the cache as a donor for its own group only, never matched by prefix
    # (radix_ext.asks.private); --no-asks-blended-donors frees it at release.
    asks_blended_donors: bool = True
    # The CPU path's linears and LM head (radix_ext.cpu.speed, backend rksc_cpu): weights packed for
    # oneDNN in this dtype; "bfloat16" rounds each linear's input and output to bf16 and sums in
    # float32, at every batch size; "int8" (x86 with AVX-512 VNNI, radix_ext.cpu.kernels) keeps int8
    # weights with a scale per 32 inputs and fuses the RMSNorms. Attention, the KV cache and
    # sampling stay float32. Default: int8 where the machine runs it (default_cpu_linear_dtype), else
    # float32; --cpu-linear-dtype float32 is the way back to the model's own numbers.
    cpu_linear_dtype: str = dataclasses.field(default_factory=default_cpu_linear_dtype)

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.type in ("bool", bool) and not isinstance(value, bool):
                raise ValueError(f"--{flag_name(field.name)} must be true or false, got {value!r}")
        _check_cgee(self)
        _check_asks(self)
        if self.cpu_linear_dtype not in CPU_LINEAR_DTYPES:
            raise ValueError(f"--cpu-linear-dtype must be one of {', '.join(CPU_LINEAR_DTYPES)}, "
                             f"got {self.cpu_linear_dtype!r}")
        if self.cpu_linear_dtype != "float32" and onednn_linears_off():
            raise ValueError(f"--cpu-linear-dtype {self.cpu_linear_dtype} packs the linears, which "
                             f"{ONEDNN_LINEARS_ENV}=0 turns off; unset it or use float32")
        if self.cpu_linear_dtype == "int8" and (why := int8_linears_unsupported()):
            raise ValueError(f"--cpu-linear-dtype int8: {why}; use bfloat16 or float32")
        if isinstance(self.max_n, bool) or not isinstance(self.max_n, int) or self.max_n < 1:
            raise ValueError(f"--max-n must be an int >= 1, got {self.max_n!r}")
        if isinstance(self.max_fanout, bool) or not isinstance(self.max_fanout, int) or self.max_fanout < 1:
            raise ValueError(f"--max-fanout must be an int >= 1, got {self.max_fanout!r}")

    @property
    def uses_backend(self) -> bool:
        return self.rsbcm or self.asks

    def server_overrides(self) -> dict[str, Any]:
        """SGLang ``ServerArgs`` fields implied by these options."""
        return {"radix_cache_backend": BACKEND_NAME} if self.uses_backend else {}

    def export_to_env(self) -> None:
        os.environ[ENV_VAR] = json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_env(cls) -> "RkscConfig":
        raw = os.environ.get(ENV_VAR)
        if not raw:
            return cls()
        try:
            values = json.loads(raw)
        except json.JSONDecodeError as e:
            raise ValueError(f"{ENV_VAR} is not valid JSON: {e}") from None
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"{ENV_VAR} has unknown option(s) {unknown}; known: {sorted(known)}")
        return cls(**values)


def check_server_args(config: RkscConfig, server: dict[str, Any]) -> None:
    """Conflicts between our options and SGLang ``ServerArgs`` fields (``server``: the fields given,
    by name), raised as ValueError naming both flags before any model loads."""
    policy = server.get("radix_eviction_policy")
    if config.rsbcm and policy not in (None, "lru", "rsbcm"):
        raise ValueError(f"--rsbcm conflicts with --radix-eviction-policy {policy}; drop one of them")
    mine = [flag for flag, on in (("--rsbcm", config.rsbcm), ("--asks", config.asks)) if on]
    if mine and server.get("disable_radix_cache"):
        raise ValueError(f"{' and '.join(mine)} need the radix cache; drop --disable-radix-cache")
    backend = server.get("radix_cache_backend")
    if mine and backend not in (None, BACKEND_NAME):
        raise ValueError(f"{' and '.join(mine)} run in --radix-cache-backend {BACKEND_NAME}, not {backend}")
    queued = server.get("max_queued_requests")
    if queued is not None and str(queued).isdigit() and int(queued) < config.max_n:
        raise ValueError(f"--max-n {config.max_n} exceeds --max-queued-requests {queued}: a request of n samples "
                         "queues n requests; lower --max-n to at most the queue")
    tp = server.get("tp_size")
    if config.asks and tp is not None and int(tp) > 1:
        raise ValueError(f"--asks needs --tp-size 1 (got {tp}): each rank would decide on its own shard's "
                         "hidden states, and ranks could disagree on a request's prompt")


def _check_cgee(config: RkscConfig) -> None:
    for name in ("cgee_tau_conf", "cgee_margin", "cgee_theta", "cgee_epsilon"):
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
            raise ValueError(f"--{flag_name(name)} must be a number >= 0, got {value!r}")
    for name in ("cgee_tau_conf", "cgee_margin"):
        if getattr(config, name) > 1:
            raise ValueError(f"--{flag_name(name)} must be in [0, 1], got {getattr(config, name)!r}")
    value = config.cgee_min_layer
    if isinstance(value, bool) or not isinstance(value, int) or value < 2:
        raise ValueError(f"--cgee-min-layer must be an int >= 2, got {value!r}")


def _check_asks(config: RkscConfig) -> None:
    for name in ("asks_tau", "asks_alpha", "asks_signature_cap_mb"):
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"--{flag_name(name)} must be a number, got {value!r}")
    if not 0 <= config.asks_tau:
        raise ValueError(f"--asks-tau must be >= 0 (1 or more never adopts), got {config.asks_tau!r}")
    if config.asks_signature_cap_mb < 0:
        raise ValueError(f"--asks-signature-cap-mb must be >= 0, got {config.asks_signature_cap_mb!r}")
    value = config.asks_min_tail
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"--asks-min-tail must be an int >= 1, got {value!r}")
    parse_layers(config.asks_layers)
    if config.asks_pooling not in POOLINGS:
        raise ValueError(f"--asks-pooling must be one of {', '.join(POOLINGS)}, got {config.asks_pooling!r}")
    if config.asks_mode not in ASKS_MODES:
        raise ValueError(f"--asks-mode must be one of {', '.join(ASKS_MODES)}, got {config.asks_mode!r}")
    if config.asks_select not in ASKS_SELECTORS:
        raise ValueError(f"--asks-select must be one of {', '.join(ASKS_SELECTORS)}, got {config.asks_select!r}")
    check_recompute("--asks-recompute", config.asks_recompute)
    value = config.asks_max_deviation
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or value <= 0:
        raise ValueError(f"--asks-max-deviation must be a number > 0 ('inf': no gate), got {value!r}")
    value = config.asks_check_layers
    if isinstance(value, bool) or not isinstance(value, int) or value < 2:
        raise ValueError(f"--asks-check-layers must be an int >= 2, got {value!r}")
    value = config.asks_fresh_tail
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"--asks-fresh-tail must be an int >= 1, got {value!r}")
    if not isinstance(config.asks_background, str) or not config.asks_background:
        raise ValueError(f"--asks-background must be 'auto', 'none' or a file path, got {config.asks_background!r}")


def check_recompute(name: str, value: Any) -> float:
    """A recompute share: a number in [0, 1]; ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ValueError(f"{name} must be a number in [0, 1], got {value!r}")
    return float(value)


def parse_layers(spec: str, num_layers: int | None = None) -> tuple[int, ...] | None:
    """``--asks-layers``: None for "all", else the sorted 1-based layer numbers; ValueError naming
    the flag (and, given ``num_layers``, a layer the model does not have)."""
    if not isinstance(spec, str):
        raise ValueError(f"--asks-layers must be 'all' or layer numbers like '10-30' or '4,8,12', got {spec!r}")
    if spec.strip() == "all":
        return None if num_layers is None else tuple(range(1, num_layers + 1))
    layers: set[int] = set()
    try:
        for part in spec.split(","):
            lo, dash, hi = part.strip().partition("-")
            first, last = int(lo), int(hi if dash else lo)
            if first < 1 or last < first:
                raise ValueError
            layers.update(range(first, last + 1))
    except ValueError:
        raise ValueError(
            f"--asks-layers must be 'all' or layer numbers >= 1 like '10-30' or '4,8,12', got {spec!r}"
        ) from None
    if num_layers is not None and max(layers) > num_layers:
        raise ValueError(f"--asks-layers {spec!r} names layer {max(layers)}; this model has {num_layers}")
    return tuple(sorted(layers))


def flag_name(field_name: str) -> str:
    return field_name.replace("_", "-")
