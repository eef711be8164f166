"""``python -m benchmarks.calibrate_cgee``: choose CGEE's thresholds for a target error, with a bound.

    python -m benchmarks.calibrate_cgee --dataset gsm8k,arc-challenge,mmlu-stem,gpqa \\
        --calibration-size 100 --reserve 60 --target-error 0.05 --per-dataset \\
        --out benchmarks/results/cgee_thresholds.json

The calibration split of each dataset is its *last* ``--calibration-size`` problems; the
evaluation split (``benchmarks.bench.bon_verify.measure``, ``programs.datasets.load(name, limit)``) is its
*first* problems, and ``--reserve`` of them are kept apart (refused if the two would overlap).

On the calibration split, best-of-N candidates are generated exactly as the table generates them
(``--shots`` exemplars in front of every question, ``--max-new-tokens``, ``--temperature``: the
bench's defaults) and verified once at full depth
with the logit lens on (every layer's entropy and Yes/No log-probabilities). Every candidate
threshold setting is then replayed offline with the runtime's own rule
(``radix_ext.cgee.rule.first_exit_layer``, the same verdict a real exit returns: the exit layer's
lens distribution), giving its decisions and its cost (verification layers run: a problem's
candidates form one batch, which runs until its last row exits; a skipped problem runs none).
CGEE error = decisions that differ from the full-depth verifier's. Among the settings whose
one-sided 95% Clopper-Pearson upper bound on that error is <= ``--target-error``, the cheapest
is written to ``--out``, with the numbers it was chosen on. Choosing among many settings on the
same data makes this bound optimistic: the bound that counts is the one ``benchmarks.bon_verify``
reports on the disjoint evaluation split.

The datasets' splits are pooled for ``thresholds`` (``RkscConfig``'s defaults). A pooled bound
can hide one dataset's much higher error (SmolLM2-135M: MMLU-STEM's 4-way answers agree by
chance, so confident skips are wrong more often), so ``--per-dataset`` also runs the search on
each dataset's split alone and writes ``per_dataset``; ``CgeeThresholds.load(path, dataset)``
prefers that entry. Each is calibrated on its dataset's problems only, so its bound is wider.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import sys

import torch

from benchmarks.bench.stats import clopper_pearson_upper95
from rksc_sgl.confidence import answer_confidences, skip_decision

THETAS = (0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
EPSILONS = (0.02, 0.05, 0.1, 0.2, 0.35, 0.5, 1.0, 2.0)
MIN_LAYERS = (*range(2, 20, 2), *range(20, 31))
TAU_CONFS = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)
MARGINS = (0.0, 0.2, 0.4, 0.5, 0.6, 0.8, 1.0)


@dataclasses.dataclass(frozen=True)
class CalibrationSet:
    """Full-depth lens diagnostics of P problems with N candidates and L layers each."""

    entropies: torch.Tensor  # [P, N, L] float64, nats
    lens_scores: torch.Tensor  # [P, N, L] P(Yes) of the lens at each layer (at L: the final output's)
    decision_codes: torch.Tensor  # [P, N] int: candidates with equal decisions share a code
    full_decision: torch.Tensor  # [P] int: code of the full-depth verifier's decision
    answer_confidence: list[dict[int, float]]  # per problem: C(a) by decision code (level 1)


def load_records(records: list[dict]) -> CalibrationSet:
    entropies, lens_scores, codes, full, confidence = [], [], [], [], []
    for r in records:
        keys = [a if a is not None else f"#{i}" for i, a in enumerate(r["answers"])]
        code_of = {k: j for j, k in enumerate(dict.fromkeys(keys))}
        codes.append([code_of[k] for k in keys])
        scores = r["scores"]
        full.append(code_of[keys[max(range(len(scores)), key=lambda i: (scores[i], -i))]])
        entropies.append(r["entropies"])
        # A row that reaches layer L is not substituted: its verdict is the model's own output,
        # which the lens at L equals only up to rounding (enough to flip a near-tie).
        lens_scores.append([row[:-1] + [final] for row, final in zip(r["lens_scores"], scores)])
        answers = [code_of[a] if a is not None else None for a in r["answers"]]
        confidence.append(answer_confidences(answers, r["confidences"]))
    return CalibrationSet(torch.tensor(entropies, dtype=torch.float64), torch.tensor(lens_scores, dtype=torch.float64),
                          torch.tensor(codes), torch.tensor(full), confidence)


def exit_layers(entropies: torch.Tensor, theta: float, epsilon: float, min_layer: int) -> torch.Tensor:
    """``first_exit_layer`` vectorised: [..., L] entropies -> [...] exit layer in 1..L."""
    num_layers = entropies.shape[-1]
    delta = torch.full_like(entropies, float("inf"))
    delta[..., 1:] = (entropies[..., 1:] - entropies[..., :-1]).abs()
    layer = torch.arange(1, num_layers + 1)
    fires = (entropies < theta) & (delta < epsilon) & (layer >= min_layer)
    fires[..., -1] = True  # never exiting = running to layer L
    return fires.int().argmax(dim=-1) + 1


def exit_outcome(data: CalibrationSet, theta: float, epsilon: float, min_layer: int):
    """Per problem: whether the early-exit decision differs from full depth, and layers run."""
    layers = exit_layers(data.entropies, theta, epsilon, min_layer)  # [P, N]
    scores = data.lens_scores.gather(-1, (layers - 1).unsqueeze(-1)).squeeze(-1)  # [P, N]
    n = scores.shape[1]
    # argmax with ties to the lowest index, as verify() does
    winner = (scores - torch.arange(n) * 1e-12).argmax(dim=-1)
    decision = data.decision_codes.gather(1, winner.unsqueeze(1)).squeeze(1)
    return decision != data.full_decision, layers.max(dim=1).values


def skip_outcome(data: CalibrationSet, tau_conf: float, margin: float):
    """Per problem: whether level 1 skips, and whether a skip decision differs from full depth."""
    decisions = [skip_decision(c, tau_conf, margin) for c in data.answer_confidence]
    skipped = torch.tensor([d.skip for d in decisions])
    wrong = torch.tensor([d.skip and d.winner != full for d, full in zip(decisions, data.full_decision.tolist())])
    return skipped, wrong


def lens_agreement(data: CalibrationSet) -> list[float]:
    """Per layer l: the fraction of problems decided as at full depth when every candidate exits at l."""
    num_layers = data.entropies.shape[-1]
    return [round(float(exit_outcome(data, float("inf"), float("inf"), l)[0].logical_not().float().mean()), 3)
            for l in range(2, num_layers + 1)]


def search(data: CalibrationSet, target_error: float) -> dict:
    """The cheapest setting whose error bound on ``data`` is <= target (ties: fewer errors, then
    the more conservative setting)."""
    num_problems, num_layers = data.entropies.shape[0], data.entropies.shape[-1]
    max_errors = max((k for k in range(num_problems + 1) if clopper_pearson_upper95(k, num_problems) <= target_error),
                     default=None)
    if max_errors is None:
        floor = clopper_pearson_upper95(0, num_problems)
        raise ValueError(f"no setting meets --target-error {target_error}: even with no error the bound on "
                         f"{num_problems} problems is {floor}; calibrate on more problems or raise the target")
    exit_cfgs = list(itertools.product(THETAS, EPSILONS, MIN_LAYERS))
    outcomes = [exit_outcome(data, *cfg) for cfg in exit_cfgs]
    exit_wrong = torch.stack([w for w, _ in outcomes])  # [E, P]
    exit_layers_run = torch.stack([n for _, n in outcomes])  # [E, P]
    best = None
    for skip_cfg in itertools.product(TAU_CONFS, MARGINS):
        skipped, skip_wrong = skip_outcome(data, *skip_cfg)
        errors = torch.where(skipped, skip_wrong, exit_wrong).sum(dim=1)  # [E]
        cost = torch.where(skipped, torch.zeros_like(exit_layers_run), exit_layers_run).sum(dim=1)  # [E]
        for e in torch.nonzero(errors <= max_errors).flatten().tolist():
            theta, epsilon, min_layer = exit_cfgs[e]
            key = (int(cost[e]), int(errors[e]), -skip_cfg[0], -skip_cfg[1], -min_layer, theta, epsilon)
            if best is None or key < best[0]:
                best = (key, skip_cfg, exit_cfgs[e], skipped, exit_layers_run[e])
    (cost, errors, *_), skip_cfg, exit_cfg, skipped, layers = best
    verified = ~skipped
    return {
        "thresholds": dict(zip(("tau_conf", "margin"), skip_cfg)) | dict(zip(("theta", "epsilon", "min_layer"), exit_cfg)),
        "calibration": {
            "n_problems": num_problems, "errors": errors, "error": round(errors / num_problems, 4),
            "error_ub95": clopper_pearson_upper95(errors, num_problems),
            "skip_rate": round(float(skipped.float().mean()), 4),
            "mean_batch_exit_layer": round(float(layers[verified].float().mean()), 2) if verified.any() else None,
            "layer_fraction_vs_full": round(cost / (num_problems * num_layers), 4),
        },
    }


def per_dataset(records: list[dict], target_error: float) -> dict[str, dict]:
    """``search`` on each dataset's records alone: {dataset: {"thresholds", "calibration"}}."""
    names = dict.fromkeys(r["dataset"] for r in records)
    return {name: search(load_records([r for r in records if r["dataset"] == name]), target_error)
            for name in names}


def collect(backend, datasets: list[str], size: int, reserve: int, num_candidates: int, seed: int, *,
            shots: int = 3, max_new_tokens: int = 96, temperature: float = 0.7) -> list[dict]:
    """Full-depth lens diagnostics on each dataset's last ``size`` problems, the candidates sampled
    as ``benchmarks.bench --workload bon-verify`` samples them: the same ``shots`` exemplars (the
    dataset's first problems) in front of every question, the same new tokens and temperature."""
    from benchmarks.bench.bon_verify import solve_batch
    from programs.datasets import load
    from programs.sampling import SamplingConfig

    records = []
    for name in datasets:
        problems = load(name)
        if reserve + size > len(problems):
            raise ValueError(f"--calibration-size {size} + --reserve {reserve} exceed {name}'s {len(problems)} problems")
        if shots > reserve:
            raise ValueError(f"--shots {shots} exceeds --reserve {reserve}: the exemplars must be held apart too")
        config = SamplingConfig(num_candidates, max_new_tokens, temperature, seed)
        results, _, _ = solve_batch(problems[-size:], config, backend, modes={"full": None}, lens=True,
                                    exemplars=tuple(problems[:shots]))
        for r in results:
            v = r.verdicts["full"]
            records.append({"dataset": name, "id": r.problem.id, "gold": r.problem.answer,
                            "answers": [c.answer for c in r.candidates], "confidences": list(v.confidences),
                            "scores": list(v.scores), "entropies": [list(e) for e in v.entropies],
                            "lens_scores": [list(s) for s in v.lens_scores]})
        print(f"{name}: {len(results)} calibration problems collected", file=sys.stderr)
    return records


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.calibrate_cgee", description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="gsm8k", help="comma-separated; the splits are pooled")
    p.add_argument("--calibration-size", type=int, default=40, help="problems per dataset (its last ones)")
    p.add_argument("--reserve", type=int, default=60, help="first problems kept for evaluation")
    p.add_argument("--num-candidates", type=int, default=4)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--shots", type=int, default=3,
                   help="exemplars in front of every question, as benchmarks.bench --shots (default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=96,
                   help="per candidate, as benchmarks.bench --max-new-tokens (default: %(default)s)")
    p.add_argument("--temperature", type=float, default=0.7,
                   help="as benchmarks.bench --temperature (default: %(default)s)")
    p.add_argument("--target-error", type=float, default=0.05, help="bound on the 95%% upper bound of CGEE error")
    p.add_argument("--out", default="benchmarks/results/cgee_thresholds.json")
    p.add_argument("--raw", default="benchmarks/results/cgee_calibration_raw.json",
                   help="where the diagnostics are saved (read back with --from-raw)")
    p.add_argument("--from-raw", action="store_true", help="search again on saved diagnostics, no engine")
    p.add_argument("--per-dataset", action="store_true",
                   help="also choose thresholds for each dataset on its own split (per_dataset in --out)")
    args = p.parse_args(argv)
    if not 0 < args.target_error < 1:
        p.error(f"--target-error must be in (0, 1), got {args.target_error}")
    if args.shots < 0 or args.max_new_tokens < 1 or args.temperature < 0:
        p.error(f"--shots must be >= 0, --max-new-tokens >= 1 and --temperature >= 0, got "
                f"{args.shots}, {args.max_new_tokens}, {args.temperature}")
    datasets = [d for d in args.dataset.split(",") if d]
    if args.from_raw:
        with open(args.raw) as f:
            records = [r for r in json.load(f) if r["dataset"] in datasets]
    else:
        from rksc_sgl.engine import launch_engine
        from rksc_sgl.engine_endpoint import RkscEngineEndpoint

        backend = RkscEngineEndpoint(launch_engine(log_level="error"))
        try:
            records = collect(backend, datasets, args.calibration_size, args.reserve, args.num_candidates, args.seed,
                              shots=args.shots, max_new_tokens=args.max_new_tokens, temperature=args.temperature)
        finally:
            backend.shutdown()
        os.makedirs(os.path.dirname(args.raw) or ".", exist_ok=True)
        with open(args.raw, "w") as f:
            json.dump(records, f)
    data = load_records(records)
    chosen = search(data, args.target_error)
    chosen["calibration"]["decision_agreement_if_all_exit_at_layer"] = dict(
        zip(range(2, data.entropies.shape[-1] + 1), lens_agreement(data)))
    if args.per_dataset:
        chosen["per_dataset"] = per_dataset(records, args.target_error)
    chosen |= {"target_error": args.target_error, "datasets": datasets,
               "calibration_split": f"last {args.calibration_size} problems of each dataset",
               "candidates": {"shots": args.shots, "max_new_tokens": args.max_new_tokens,
                              "temperature": args.temperature, "num_candidates": args.num_candidates},
               "command": "python -m benchmarks.calibrate_cgee " + " ".join(sys.argv[1:] if argv is None else argv)}
    with open(args.out, "w") as f:
        json.dump(chosen, f, indent=2)
        f.write("\n")
    print(json.dumps(chosen, indent=2))


if __name__ == "__main__":
    main()
