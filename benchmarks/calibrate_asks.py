"""``python -m benchmarks.calibrate_asks``: choose ASKS's signature, layers, alpha and tau.

On ``programs.paraphrases.CALIBRATION`` (instruction families never used by a workload): pairs
within a family should adopt, pairs across families must not. Each instruction is a span after
the chat template's system header, as the ``paraphrase-sc`` program commits it; its signature
is the mean over its tokens of every decoder layer's output (residual stream included), computed
here with transformers on the same checkpoint (the runtime computes the same states with
SGLang's kernels; ``tests/integration/test_asks.py`` checks the two sigmas agree).

Grid: signature raw or centred on the calibration background (the mean of all calibration
signatures), probed layers (all, first / middle / last third, second half), alpha in
{0, 1, 2, 4}. For each, tau is the smallest value above every cross-family sigma plus
``--margin``; the choice maximises the within-family accept rate at that tau (ties: larger gap).
The evaluation family (``EVAL``: the workload's paraphrases and its controls) is scored with the
chosen settings for the record only.

Writes ``benchmarks/results/asks_calibration.json`` (the grid, the choice, accept rates) and the
background to ``radix_ext/asks_backgrounds/<model>.pt`` (what ``--asks-background auto`` loads).
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import torch

from benchmarks.records import git_commit, machine
from programs.paraphrases import CALIBRATION, EVAL
from radix_ext import asks_background
from radix_ext.asks_gate import layer_weights, similarity

HEAD = "<|im_start|>system\n"
ALPHAS = (0.0, 1.0, 2.0, 4.0)


def layer_sets(num_layers: int) -> dict[str, tuple[int, ...]]:
    third = num_layers // 3
    return {
        "all": tuple(range(1, num_layers + 1)),
        "first-third": tuple(range(1, third + 1)),
        "middle-third": tuple(range(third + 1, 2 * third + 1)),
        "last-third": tuple(range(2 * third + 1, num_layers + 1)),
        "second-half": tuple(range(num_layers // 2 + 1, num_layers + 1)),
    }


@torch.no_grad()
def signatures(model, tokenizer, texts: list[str]) -> torch.Tensor:
    """[len(texts), num_layers, hidden]: each span's mean full hidden state per layer."""
    head = tokenizer(HEAD, add_special_tokens=False).input_ids
    out = []
    for text in texts:
        ids = tokenizer(HEAD + text, add_special_tokens=False).input_ids
        if ids[: len(head)] != head:
            raise ValueError(f"the header does not tokenize apart from {text!r}")
        states: list[torch.Tensor] = []
        hooks = [layer.register_forward_hook(lambda m, a, o: states.append(o[0] if isinstance(o, tuple) else o))
                 for layer in model.model.layers]
        try:
            model(torch.tensor([ids]))
        finally:
            for hook in hooks:
                hook.remove()
        out.append(torch.stack([s[0, len(head):].float().mean(dim=0) for s in states]))
    return torch.stack(out)


def sigmas(sig: torch.Tensor, pairs: list[tuple[int, int]], layers, num_layers, alpha, background) -> list[float]:
    index = [layer - 1 for layer in layers]
    weights = layer_weights(tuple(layers), num_layers, alpha)
    bg = None if background is None else background[index]
    return [similarity(sig[i][index], sig[j][index], weights, bg) for i, j in pairs]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.calibrate_asks", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-path", default=None, help="local HF folder (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--margin", type=float, default=0.02, help="tau above the largest cross-family sigma")
    parser.add_argument("--output", default="benchmarks/results/asks_calibration.json")
    parser.add_argument("--background-output", default=None,
                        help="default: radix_ext/asks_backgrounds/<model folder name>.pt")
    args = parser.parse_args(argv)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rksc_sgl.model_cache import default_model_path

    path = args.model_path or default_model_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    num_layers = model.config.num_hidden_layers

    texts = [t for family in CALIBRATION for t in family.paraphrases]
    family_of = [family.name for family in CALIBRATION for _ in family.paraphrases]
    cal = signatures(model, tokenizer, texts)
    background = cal.mean(dim=0)
    pos = [(i, j) for i, j in itertools.combinations(range(len(texts)), 2) if family_of[i] == family_of[j]]
    neg = [(i, j) for i, j in itertools.combinations(range(len(texts)), 2) if family_of[i] != family_of[j]]

    grid = []
    for (centre, bg), (layers_name, layers), alpha in itertools.product(
            (("raw", None), ("centred", background)), layer_sets(num_layers).items(), ALPHAS):
        p = sigmas(cal, pos, layers, num_layers, alpha, bg)
        n = sigmas(cal, neg, layers, num_layers, alpha, bg)
        tau = round(max(n) + args.margin, 3)
        grid.append({"signature": centre, "layers": layers_name, "alpha": alpha, "tau": tau,
                     "accept_within": sum(x >= tau for x in p) / len(p), "gap": min(1.0, max(p)) - max(n)})
    best = max(grid, key=lambda g: (g["accept_within"], g["gap"]))
    layers = layer_sets(num_layers)[best["layers"]]
    bg = background if best["signature"] == "centred" else None

    ev = signatures(model, tokenizer, list(EVAL.paraphrases) + list(EVAL.controls))
    k = len(EVAL.paraphrases)
    ev_pos = sigmas(ev, list(itertools.combinations(range(k), 2)), layers, num_layers, best["alpha"], bg)
    ev_ctl = sigmas(ev, [(i, k + j) for i in range(k) for j in range(len(EVAL.controls))], layers,
                    num_layers, best["alpha"], bg)
    tau = best["tau"]
    result = {
        "commit": git_commit(), "machine": machine(),
        "command": "python -m benchmarks.calibrate_asks " + " ".join(argv or []),
        "model": Path(path).name, "num_layers": num_layers,
        "calibration": {"families": len(CALIBRATION), "within_pairs": len(pos), "across_pairs": len(neg),
                        "margin": args.margin},
        "choice": {**best, "layer_numbers": f"{layers[0]}-{layers[-1]}"},
        "calibration_false_accept": 0.0,
        "eval_family": {"paraphrase_pairs": len(ev_pos), "accept_rate": sum(x >= tau for x in ev_pos) / len(ev_pos),
                        "sigma_range": [min(ev_pos), max(ev_pos)],
                        "control_pairs": len(ev_ctl), "false_accept_rate": sum(x >= tau for x in ev_ctl) / len(ev_ctl),
                        "control_sigma_max": max(ev_ctl)},
        "grid": grid,
    }
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(result, indent=1) + "\n")
    out = Path(args.background_output) if args.background_output else \
        asks_background.PACKAGED / f"{Path(path).name.lower()}.pt"
    asks_background.save(out, background=background, model_fp=asks_background.fingerprint(model.model.norm.weight),
                         model_name=Path(path).name)
    print(json.dumps({k: result[k] for k in ("choice", "eval_family")}, indent=1))
    print(f"wrote {args.output} and {out}")


if __name__ == "__main__":
    main()
