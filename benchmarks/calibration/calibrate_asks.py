"""``python -m benchmarks.calibrate_asks``: choose ASKS's signature, layers, alpha and tau.

Chosen on calibration data only, by false accepts first:

* positives: pairs within a ``programs.paraphrases.CALIBRATION`` family (should adopt);
* negatives: pairs across those families (other topics), and every (``word-problems``
  paraphrase, ``CALIBRATION_CONTROLS`` text) pair: same topic, another required answer
  (language, format, length, task, refusal), the controls a topic-level gate cannot tell apart.

Each instruction is a span after the chat template's system header, as a paraphrase program
commits it. Signatures (computed here with transformers on the same checkpoint; the runtime
computes the same states with SGLang's kernels, ``tests/integration/test_asks.py`` checks the two
sigmas agree):

* ``mean``: every decoder layer's full hidden state (residual stream included), mean-pooled over
  the span's tokens (the shipped signature until this calibration);
* ``last``: the same states at the span's last token;
* ``probe``: the span's effect on the next-token distribution at a fixed probe (a short math
  question after the span): similarity ``1 - JSD / ln 2`` of the two distributions. Offline
  only: the runtime would need one more forward per span (``runtime: false`` in the grid).

Grid for ``mean`` and ``last``: raw or centred on the calibration background (the mean
signature of every calibration text), layer sets (all, thirds, second half, each single layer,
each window of 4), alpha in {0, 1, 2, 4} for multi-layer sets. For each, tau is the smallest value
above every calibration negative plus ``--margin``; the choice maximises the calibration recall
at that tau (ties: larger gap) among runtime signatures.

Then, for the record only, the evaluation: ``EVAL.paraphrases`` pairs (recall) against
``EVAL_CONTROLS`` (same topic, math; false accepts per family) and ``EVAL.controls`` (other
topics). If the chosen gate's false-accept rate on the evaluation controls exceeds
``--target-false-accept``, the shipped tau is the safer one (``safe``): above every control sigma
seen, calibration and evaluation, plus the margin; that tau was set with the evaluation
controls in view, so its evaluation false-accept rate of 0 is no held-out measure.

Writes ``benchmarks/results/asks_calibration.json`` and the backgrounds (one per pooling) to
``radix_ext/asks/backgrounds/<model>.pt`` (what ``--asks-background auto`` loads).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
from pathlib import Path

import torch

from benchmarks.bench.records import git_commit, machine
from programs.paraphrases import CALIBRATION, CALIBRATION_CONTROLS, EVAL, EVAL_CONTROLS
from radix_ext.asks import background as asks_background
from radix_ext.asks.gate import layer_weights

HEAD = "<|im_start|>system\n"
# The fixed probe of the ``probe`` signature: the rest of a chat after the span.
PROBE = "<|im_end|>\n<|im_start|>user\nA shop sells pens at 2 dollars each. How much do 3 pens cost?<|im_end|>\n" \
        "<|im_start|>assistant\n"
ALPHAS = (0.0, 1.0, 2.0, 4.0)
WINDOW = 4


def layer_sets(num_layers: int) -> dict[str, tuple[int, ...]]:
    third = num_layers // 3
    sets = {
        "all": tuple(range(1, num_layers + 1)),
        "first-third": tuple(range(1, third + 1)),
        "middle-third": tuple(range(third + 1, 2 * third + 1)),
        "last-third": tuple(range(2 * third + 1, num_layers + 1)),
        "second-half": tuple(range(num_layers // 2 + 1, num_layers + 1)),
    }
    sets.update({f"{a}-{a + WINDOW - 1}": tuple(range(a, a + WINDOW)) for a in range(1, num_layers - WINDOW + 2)})
    sets.update({f"{layer}": (layer,) for layer in range(1, num_layers + 1)})
    return sets


@torch.no_grad()
def features(model, tokenizer, texts: list[str]) -> dict[str, torch.Tensor]:
    """Per text: ``mean`` and ``last`` [len(texts), num_layers, hidden] (layer ``l`` at row
    ``l - 1``) over the span after the header, and ``probe`` [len(texts), vocab] log-probabilities."""
    head = tokenizer(HEAD, add_special_tokens=False).input_ids
    out: dict[str, list[torch.Tensor]] = {"mean": [], "last": [], "probe": []}
    for text in texts:
        ids = tokenizer(HEAD + text, add_special_tokens=False).input_ids
        if ids[: len(head)] != head:
            raise ValueError(f"the header does not tokenize apart from {text!r}")
        probe = tokenizer(PROBE, add_special_tokens=False).input_ids
        captured: list[torch.Tensor] = []  # each decoder layer's output (before the final norm)
        hooks = [layer.register_forward_hook(lambda m, a, o: captured.append(o[0] if isinstance(o, tuple) else o))
                 for layer in model.model.layers]
        try:
            logits = model(torch.tensor([ids + probe]), logits_to_keep=1).logits
        finally:
            for hook in hooks:
                hook.remove()
        states = torch.stack(captured)[:, 0].float()  # [layers, tokens, hidden]
        out["mean"].append(states[:, len(head): len(ids)].mean(dim=1))
        out["last"].append(states[:, len(ids) - 1])
        out["probe"].append(torch.log_softmax(logits[0, -1].float(), dim=-1))
    return {k: torch.stack(v) for k, v in out.items()}


def signatures(model, tokenizer, texts: list[str], pooling: str = "mean") -> torch.Tensor:
    """[len(texts), num_layers, hidden]: each span's ``pooling`` signature at every layer."""
    return features(model, tokenizer, texts)[pooling]


def probe_similarity(a: torch.Tensor, b: torch.Tensor) -> float:
    """``1 - JSD(p, q) / ln 2`` of two log-probability vectors: 1 for the same distribution."""
    p, q = a.exp(), b.exp()
    m = 0.5 * (p + q)
    jsd = 0.5 * (p * (a - m.log())).sum() + 0.5 * (q * (b - m.log())).sum()
    return float(1 - jsd / math.log(2))


def cosines(sig: torch.Tensor, background: torch.Tensor | None) -> torch.Tensor:
    """[layers, N, N]: every layer's cosine between every two of ``sig`` [N, layers, hidden]
    (centred on ``background`` [layers, hidden] if given), what ``similarity`` averages."""
    x = sig if background is None else sig - background
    x = x / x.norm(dim=-1, keepdim=True)
    return torch.einsum("ilh,jlh->lij", x, x)


def rate(values: list[float], tau: float) -> float:
    return sum(v >= tau for v in values) / len(values) if values else 0.0


class Data:
    """Calibration and evaluation texts, their features and the pairs scored."""

    def __init__(self, model, tokenizer):
        cal_texts = [t for f in CALIBRATION for t in f.paraphrases]
        family_of = [f.name for f in CALIBRATION for _ in f.paraphrases]
        base = {f.name: [i for i, name in enumerate(family_of) if name == f.name] for f in CALIBRATION}
        self.cal_pos = [(i, j) for i, j in itertools.combinations(range(len(cal_texts)), 2) if family_of[i] == family_of[j]]
        self.cal_topic = [(i, j) for i, j in itertools.combinations(range(len(cal_texts)), 2) if family_of[i] != family_of[j]]
        self.cal_controls: dict[str, list[tuple[int, int]]] = {}
        for family in CALIBRATION_CONTROLS:
            start = len(cal_texts)
            cal_texts += family.texts
            self.cal_controls[family.name] = [(i, start + j) for i in base[family.base] for j in range(len(family.texts))]
        k = len(EVAL.paraphrases)
        ev_texts = list(EVAL.paraphrases) + list(EVAL.controls)
        self.ev_pos = list(itertools.combinations(range(k), 2))
        self.ev_topic = [(i, k + j) for i in range(k) for j in range(len(EVAL.controls))]
        self.ev_controls: dict[str, list[tuple[int, int]]] = {}
        for family in EVAL_CONTROLS:
            start = len(ev_texts)
            ev_texts += family.texts
            self.ev_controls[family.name] = [(i, start + j) for i in range(k) for j in range(len(family.texts))]
        self.cal, self.ev = features(model, tokenizer, cal_texts), features(model, tokenizer, ev_texts)
        self.cal_texts = cal_texts
        self.cal_neg = self.cal_topic + [p for v in self.cal_controls.values() for p in v]

    def backgrounds(self) -> dict[str, torch.Tensor]:
        return {pooling: self.cal[pooling].mean(dim=0) for pooling in ("mean", "last")}


def scorer(data: Data, setting: dict, num_layers: int, backgrounds, cache: dict):
    """``score(side, pairs)``: the setting's sigmas on the calibration or evaluation features
    (``radix_ext.asks.gate.similarity``, from per-layer cosine matrices kept in ``cache``)."""
    if setting["signature"] == "probe":
        return lambda side, pairs: [probe_similarity(getattr(data, side)["probe"][i], getattr(data, side)["probe"][j])
                                    for i, j in pairs]
    pooling, centred = setting["signature"], setting["centred"]
    index = [layer - 1 for layer in layer_sets(num_layers)[setting["layers"]]]
    weights = layer_weights(tuple(i + 1 for i in index), num_layers, setting["alpha"])

    def score(side: str, pairs) -> list[float]:
        key = (side, pooling, centred)
        if key not in cache:
            cache[key] = cosines(getattr(data, side)[pooling], backgrounds[pooling] if centred else None)
        sigma = (weights[:, None, None] * cache[key][index]).sum(dim=0) / weights.sum()
        i, j = zip(*pairs)
        return sigma[list(i), list(j)].tolist()

    return score


def evaluate(data: Data, score, tau: float) -> dict:
    per_family = {name: rate(score("ev", pairs), tau) for name, pairs in data.ev_controls.items()}
    controls = [s for pairs in data.ev_controls.values() for s in score("ev", pairs)]
    pos = score("ev", data.ev_pos)
    return {"tau": round(tau, 4), "paraphrase_recall": round(rate(pos, tau), 4),
            "paraphrase_sigma_min": round(min(pos), 4),
            "false_accept_rate": round(rate(controls, tau), 4), "control_sigma_max": round(max(controls), 4),
            "false_accept_by_family": {k: round(v, 4) for k, v in per_family.items()},
            "topic_control_false_accept_rate": round(rate(score("ev", data.ev_topic), tau), 4)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.calibrate_asks", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-path", default=None, help="local HF folder (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--margin", type=float, default=0.02, help="tau above the largest negative sigma")
    parser.add_argument("--target-false-accept", type=float, default=0.01,
                        help="the evaluation controls' false-accept rate the chosen gate must keep to (else: safe)")
    parser.add_argument("--output", default="benchmarks/results/asks_calibration.json")
    parser.add_argument("--background-output", default=None,
                        help="default: radix_ext/asks/backgrounds/<model folder name>.pt")
    args = parser.parse_args(argv)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rksc_sgl.model_cache import default_model_path

    path = args.model_path or default_model_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    num_layers = model.config.num_hidden_layers
    data = Data(model, tokenizer)
    backgrounds = data.backgrounds()

    settings = [{"signature": "probe", "centred": False, "layers": None, "alpha": None, "runtime": False}]
    for pooling, centred, (name, layers) in itertools.product(("mean", "last"), (False, True),
                                                              layer_sets(num_layers).items()):
        for alpha in (ALPHAS if len(layers) > 1 else (0.0,)):
            settings.append({"signature": pooling, "centred": centred, "layers": name, "alpha": alpha, "runtime": True})
    grid, cache = [], {}
    for setting in settings:
        score = scorer(data, setting, num_layers, backgrounds, cache)
        pos, neg = score("cal", data.cal_pos), score("cal", data.cal_neg)
        controls = [s for pairs in data.cal_controls.values() for s in score("cal", pairs)]
        tau = max(neg) + args.margin
        grid.append({**setting, "tau": round(tau, 4), "calibration_recall": round(rate(pos, tau), 4),
                     "gap": round(min(1.0, max(pos)) - max(neg), 4),
                     "calibration_control_sigma_max": round(max(controls), 4),
                     "calibration_topic_sigma_max": round(max(score("cal", data.cal_topic)), 4),
                     "evaluation": evaluate(data, score, tau)})
    best = max((g for g in grid if g["runtime"]), key=lambda g: (g["calibration_recall"], g["gap"]))
    score = scorer(data, best, num_layers, backgrounds, cache)
    chosen = best["evaluation"]
    every_control = (score("cal", data.cal_neg) + score("ev", data.ev_topic)
                     + [s for pairs in data.ev_controls.values() for s in score("ev", pairs)])
    safe = evaluate(data, score, max(every_control) + args.margin)
    ship_safe = chosen["false_accept_rate"] > args.target_false_accept
    shipped = safe if ship_safe else chosen
    layers = layer_sets(num_layers)[best["layers"]]
    result = {
        "commit": git_commit(), "machine": machine(),
        "command": "python -m benchmarks.calibrate_asks " + " ".join(argv or []),
        "model": Path(path).name, "num_layers": num_layers, "margin": args.margin,
        "target_false_accept": args.target_false_accept,
        "calibration": {"families": [f.name for f in CALIBRATION], "within_pairs": len(data.cal_pos),
                        "across_topic_pairs": len(data.cal_topic),
                        "control_families": {f.name: {"kind": f.kind, "base": f.base, "pairs": len(data.cal_controls[f.name])}
                                             for f in CALIBRATION_CONTROLS}},
        "evaluation": {"paraphrase_pairs": len(data.ev_pos), "topic_control_pairs": len(data.ev_topic),
                       "control_families": {f.name: {"kind": f.kind, "base": f.base, "pairs": len(data.ev_controls[f.name])}
                                            for f in EVAL_CONTROLS}},
        "choice": {k: best[k] for k in ("signature", "centred", "layers", "alpha", "tau", "calibration_recall", "gap")},
        "choice_layer_numbers": ",".join(map(str, layers)),
        "choice_on_evaluation": chosen,
        "safe_on_evaluation": safe,
        "shipped": {"setting": "safe" if ship_safe else "choice", **shipped},
        "best_evaluation_false_accept_at_its_calibrated_tau": min(g["evaluation"]["false_accept_rate"] for g in grid),
        "grid": grid,
    }
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(result, indent=1) + "\n")
    out = Path(args.background_output) if args.background_output else \
        asks_background.PACKAGED / f"{Path(path).name.lower()}.pt"
    asks_background.save(out, backgrounds=backgrounds, model_fp=asks_background.fingerprint(model.model.norm.weight),
                         model_name=Path(path).name)
    print(json.dumps({k: result[k] for k in ("choice", "choice_on_evaluation", "safe_on_evaluation", "shipped",
                                              "best_evaluation_false_accept_at_its_calibrated_tau")}, indent=1))
    print(f"wrote {args.output} and {out}")


if __name__ == "__main__":
    main()
