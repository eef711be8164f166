"""The benchmark's modes: which rksc-sgl mechanisms are on, and how the engine is configured.

``no-cache`` and ``exact`` are stock SGLang (radix cache disabled / SGLang's default radix cache
with LRU); ``exact-again`` is ``exact`` run a second time in each repeat, the A/A control: its ratio
to ``exact`` is how far two identical runs read apart on the machine, the resolution every other
mode's ratio is read against; ``rksc-lru`` is our cache class (``radix_ext.eviction.backend``) under stock
LRU with no mechanism on, so a table tells the class's cost from the policy's; ``rksc`` turns on every
mechanism that has landed; the ``*-only`` modes are the ablations (``asks-only``: ASKS at the
server's defaults, blend since issue 35); ``asks-adopt`` is ASKS in its wording-adoption mode;
``exact-reseed`` is ``exact`` sampling with another seed base (``RESEED_OFFSET``): its agreement
with ``exact`` is the two-seed noise floor that quality against exact is read against;
``exact-float32`` is ``exact`` with float32 linears whatever the run's ``--cpu-linear-dtype``: in a
run on int8 (the default where the CPU has VNNI) it is what the linears buy, in time and in
agreement, on the same problems;
``asks-blend@R`` (``--asks-recompute-sweep``, ``sweep_modes``) is blend with every request asking
for recompute share R (``AsksOptions.recompute``) and the gate off (``--asks-max-deviation inf``:
the share alone, so that the curve shows what the share buys); ``asks-check@L:G``
(``--asks-check-sweep``, ``check_sweep_modes``) is blend at the server's share with an
``L``-layer check (``--asks-check-layers``) and the gate at ``G`` (``--asks-max-deviation``), so
that check depths are compared at the gates that flag alike; ``adaptive`` is ``exact`` plus
the run's stop rule (``--stop-rule``): each problem's branches are sampled in rounds until the rule
decides its vote; ``group-stop`` is ``exact`` plus the same rule as the runtime's group policy:
every branch is launched at once, as in ``exact``, and the scheduler stops those still running
once the vote over the finished ones is decided; ``group-stop+trace`` adds a trace-confidence stop
(``--trace-stop T``) to every branch, whose stopped traces cast no vote. A mode that needs a mechanism
which has not landed is refused, naming it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from rksc_sgl.config import BACKEND_NAME, RkscConfig

MECHANISMS = ("asks", "cgee", "rsbcm")
LANDED: frozenset[str] = frozenset({"rsbcm", "cgee", "asks"})  # grows as mechanisms land
RESEED_OFFSET = 1_000_003  # exact-reseed's seed base: --seed + this
SWEEP_PREFIX = "asks-blend@"
CHECK_PREFIX = "asks-check@"


@dataclasses.dataclass(frozen=True)
class Mode:
    name: str
    mechanisms: frozenset[str] = frozenset()
    disable_radix_cache: bool = False
    backend: str | None = None  # --radix-cache-backend; None: what the mechanisms imply
    adaptive: bool = False  # sample under the run's stop rule (``BenchSettings.stop_rule``)
    group_stop: bool = False  # ... applied by the scheduler's group stop rather than in rounds
    trace_stop: bool = False  # every branch also carries the run's trace-confidence stop (--trace-stop)
    asks_mode: str | None = None  # --asks-mode; None: RkscConfig's default
    # Blend: the recompute share every request of the workload asks for (AsksOptions.recompute);
    # None: the server's --asks-recompute.
    recompute: float | None = None
    # Blend: the server's --asks-max-deviation (the gate); None: RkscConfig's default.
    max_deviation: float | None = None
    # Blend: the server's --asks-check-layers; None: RkscConfig's default.
    check_layers: int | None = None
    seed_offset: int = 0  # added to the run's --seed (exact-reseed: the two-seed noise floor)
    linear_dtype: str | None = None  # the CPU path's linears; None: the run's --cpu-linear-dtype

    def rksc_config(self) -> RkscConfig:
        asks = {"asks_mode": self.asks_mode} if self.asks_mode else {}
        if self.max_deviation is not None:
            asks["asks_max_deviation"] = self.max_deviation
        if self.check_layers is not None:
            asks["asks_check_layers"] = self.check_layers
        return RkscConfig(rsbcm="rsbcm" in self.mechanisms, asks="asks" in self.mechanisms, **asks)

    def engine_config(self, linear_dtype: str) -> RkscConfig:
        """The engine's options in a run whose ``--cpu-linear-dtype`` is ``linear_dtype``."""
        return dataclasses.replace(self.rksc_config(), cpu_linear_dtype=self.linear_dtype or linear_dtype)

    def gate_asked(self, own: float | None) -> float | None:
        """The blend gate a workload's requests ask in this mode (``AsksOptions.max_deviation``):
        the workload's ``own`` unless the mode sets the server's (``asks-check@``, ``asks-blend@``:
        the curves measure the server's); None: the server's."""
        return own if self.max_deviation is None else None

    @property
    def effective_asks_mode(self) -> str | None:
        """"blend" or "adopt" where ASKS is on, else None."""
        return self.rksc_config().asks_mode if "asks" in self.mechanisms else None

    def engine_overrides(self) -> dict[str, Any]:
        if self.disable_radix_cache:
            return {"disable_radix_cache": True}
        return {"radix_cache_backend": self.backend} if self.backend else {}

    @property
    def cgee(self) -> bool:
        return "cgee" in self.mechanisms

    @property
    def cache_class(self) -> str:
        """The KV cache this mode runs in and its eviction order, as the tables name them."""
        if self.disable_radix_cache:
            return "no radix cache"
        if self.backend is None and not self.rksc_config().uses_backend:
            return "SGLang's `UnifiedRadixCache`, LRU"
        return f"our `RkscRadixCache`, {'RSBCM' if 'rsbcm' in self.mechanisms else 'LRU'}"


MODES: dict[str, Mode] = {
    "no-cache": Mode("no-cache", disable_radix_cache=True),
    "exact": Mode("exact"),
    "exact-again": Mode("exact-again"),
    "rksc-lru": Mode("rksc-lru", backend=BACKEND_NAME),
    "adaptive": Mode("adaptive", adaptive=True),
    "group-stop": Mode("group-stop", adaptive=True, group_stop=True),
    "group-stop+trace": Mode("group-stop+trace", adaptive=True, group_stop=True, trace_stop=True),
    "rksc": Mode("rksc", frozenset(MECHANISMS) & LANDED),
    "asks-only": Mode("asks-only", frozenset({"asks"})),
    "asks-adopt": Mode("asks-adopt", frozenset({"asks"}), asks_mode="adopt"),
    "exact-reseed": Mode("exact-reseed", seed_offset=RESEED_OFFSET),
    "exact-float32": Mode("exact-float32", linear_dtype="float32"),
    "cgee-only": Mode("cgee-only", frozenset({"cgee"})),
    "rsbcm-only": Mode("rsbcm-only", frozenset({"rsbcm"})),
}


def resolve_modes(spec: str) -> list[Mode]:
    """Parse ``--modes`` (comma-separated); raise ValueError naming a bad or unlanded mode."""
    modes = []
    for name in (part.strip() for part in spec.split(",") if part.strip()):
        if name not in MODES:
            raise ValueError(f"--modes: unknown mode {name!r}; valid: {', '.join(MODES)}")
        mode = MODES[name]
        missing = sorted(mode.mechanisms - LANDED)
        if missing:
            raise ValueError(f"--modes: {name!r} needs {', '.join(m.upper() for m in missing)}, "
                             "which has not landed yet")
        modes.append(mode)
    if not modes:
        raise ValueError("--modes: give at least one mode")
    return modes


def _sweep(flag: str, spec: str, what: str, example: str, mode_of) -> list[Mode]:
    """One mode per comma-separated part of ``spec`` (``mode_of(part)``, a ValueError naming the
    part); ValueError naming ``flag`` if a part is bad, none is given or one repeats."""
    modes = []
    for part in (x.strip() for x in spec.split(",") if x.strip()):
        try:
            modes.append(mode_of(part))
        except ValueError as e:
            raise ValueError(f"{flag}: {part!r} is not {what} ({e})") from e
    if not modes:
        raise ValueError(f"{flag}: give at least one {what}, e.g. {example}")
    if len({m.name for m in modes}) != len(modes):
        raise ValueError(f"{flag}: a {what} is repeated in {spec!r}")
    return modes


def sweep_modes(spec: str) -> list[Mode]:
    """``--asks-recompute-sweep``: one blend mode per comma-separated share in [0, 1], named
    ``asks-blend@<share>``; ValueError naming the flag."""
    from rksc_sgl.config import check_recompute

    def mode_of(part: str) -> Mode:
        share = check_recompute("--asks-recompute-sweep", float(part))
        return Mode(f"{SWEEP_PREFIX}{share:g}", frozenset({"asks"}), asks_mode="blend", recompute=share,
                    max_deviation=math.inf)

    return _sweep("--asks-recompute-sweep", spec, "a share in [0, 1]", "0,0.15,1.0", mode_of)


def check_sweep_modes(spec: str) -> list[Mode]:
    """``--asks-check-sweep``: one blend mode per comma-separated ``LAYERS:GATE`` (an
    ``--asks-check-layers`` value and an ``--asks-max-deviation`` value), named
    ``asks-check@<layers>:<gate>``; ValueError naming the flag and the bad part."""
    def mode_of(part: str) -> Mode:
        layers, _, gate = part.partition(":")
        config = RkscConfig(asks_check_layers=int(layers), asks_max_deviation=float(gate))
        return Mode(f"{CHECK_PREFIX}{config.asks_check_layers}:{config.asks_max_deviation:g}", frozenset({"asks"}),
                    asks_mode="blend", max_deviation=config.asks_max_deviation, check_layers=config.asks_check_layers)

    return _sweep("--asks-check-sweep", spec, "LAYERS:GATE (an int >= 2, a number > 0)", "2:0.025,4:0.07", mode_of)
