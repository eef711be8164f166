"""What ASKS's substitutions do to outputs, and how often its gate accepts a non-equivalent span.

For each branch that adopted a donor's wording (``meta_info["rksc_asks"]["adopted"]``), against
the same branch in the ``exact`` mode (its own wording, same seed):

* ``rouge_l``: ROUGE-L F1 (longest common subsequence of whitespace tokens) of the two texts;
* ``first_token_kl``: KL(exact || substituted) of the first generated token's distribution, on
  exact's top-20 tokens renormalised (a token missing from the substituted top-20 gets its
  smallest log-probability there);
* ``mean_abs_dlogprob_16``: mean |delta log-probability| of the sampled tokens over the first
  16 positions, up to the first position where the two branches drew different tokens.

Beside them, the noise floor: ROUGE-L between a substituted branch and branch 0 of the same
mode and problem (one prompt, two seeds), the comparison SGLang's fuzzy-match radix PR (#31057)
reports its 0.88 floor for.

``control_probe``: every evaluation paraphrase against every control instruction in the running
engine, the controls that change the topic (``programs.paraphrases.EVAL.controls``) and those that
keep it and change what the answer must be (``EVAL_CONTROLS``), each control the only donor (its
tail is unique to the pair): the runtime's false-accept rates (over the pairs where the control
was a candidate) and sigmas.
"""

from __future__ import annotations

import math
import statistics
from typing import Any


def rouge_l(a: str, b: str) -> float:
    x, y = a.split(), b.split()
    if not x or not y:
        return float(x == y)
    previous = [0] * (len(y) + 1)
    for token in x:
        current = [0]
        for j, other in enumerate(y):
            current.append(previous[j] + 1 if token == other else max(previous[j + 1], current[j]))
        previous = current
    lcs = previous[-1]
    if lcs == 0:
        return 0.0
    p, r = lcs / len(x), lcs / len(y)
    return 2 * p * r / (p + r)


def top_kl(reference: dict[int, float], other: dict[int, float]) -> float | None:
    """KL(reference || other) on reference's top tokens, both renormalised there."""
    if not reference or not other:
        return None
    floor = min(other.values())
    ids = list(reference)
    p = [math.exp(reference[i]) for i in ids]
    q = [math.exp(other.get(i, floor)) for i in ids]
    sp, sq = sum(p), sum(q)
    return sum(pi / sp * math.log((pi / sp) / (qi / sq)) for pi, qi in zip(p, q) if pi > 0)


def logprob_delta(ids_a, lps_a, ids_b, lps_b, positions: int = 16) -> float | None:
    deltas = []
    for ia, la, ib, lb in zip(ids_a[:positions], lps_a, ids_b, lps_b):
        if ia != ib:
            break
        deltas.append(abs(la - lb))
    return statistics.fmean(deltas) if deltas else None


def _mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return round(statistics.fmean(values), 4) if values else None


def substitution_quality(results, exact_results) -> dict[str, Any]:
    """Per-run summary over the adopted branches (``ParaResult`` lists of one mode and of exact)."""
    rouge, floor, kl, dlp = [], [], [], []
    for mine, ref in zip(results, exact_results):
        for b, (branch, ref_branch) in enumerate(zip(mine.branches, ref.branches)):
            if not (branch.asks and branch.asks.get("adopted")):
                continue
            rouge.append(rouge_l(branch.text, ref_branch.text))
            if b > 0:
                floor.append(rouge_l(branch.text, mine.branches[0].text))
            kl.append(top_kl(ref_branch.first_top_logprobs, branch.first_top_logprobs))
            dlp.append(logprob_delta(branch.token_ids, branch.token_logprobs, ref_branch.token_ids,
                                     ref_branch.token_logprobs))
    return {"asks_substituted_branches": len(rouge), "asks_rouge_l_vs_own_wording": _mean(rouge),
            "asks_rouge_l_two_seeds_one_prompt": _mean(floor), "asks_first_token_kl": _mean(kl),
            "asks_mean_abs_dlogprob_16": _mean(dlp)}


def control_probe(backend) -> dict[str, Any]:
    """The gate on every (paraphrase, control) pair, in the engine: false-accept rates and sigmas,
    for the controls that change the topic (``EVAL.controls``: ``asks_control_*``, ``asks_false_accept_rate``)
    and for those that keep it and change the answer asked for (``EVAL_CONTROLS``, held out of the
    gate's calibration: ``asks_same_topic_*``, per kind). All of the probe's requests are one
    substitution group of their own (what a program that declared controls and paraphrases
    interchangeable would send), so only the gate decides."""
    import collections
    import uuid

    from programs.paraphrases import EVAL, EVAL_CONTROLS
    from rksc_sgl.protocol import ASKS_KEY, AsksOptions

    group = AsksOptions(group=f"control-probe-{uuid.uuid4().hex}").to_custom_params()
    head, suffix = backend.chat_template.get_prefix_and_suffix("system", [])
    user = backend.chat_template.get_prefix_and_suffix("user", [])[0]
    controls = [("topic", text) for text in EVAL.controls]
    controls += [(family.kind, text) for family in EVAL_CONTROLS for text in family.texts]
    for text in [*EVAL.paraphrases, *(text for _, text in controls)]:
        backend.prefill(head + text, custom_params=group)
    accepted, sigmas = collections.Counter(), collections.defaultdict(list)
    for j, (kind, control) in enumerate(controls):
        for i, paraphrase in enumerate(EVAL.paraphrases):
            tail = (f"{suffix}{user}Probe {j}.{i}: this is a control request that only checks whether "
                    f"two different system messages are treated as the same one.")
            backend.prefill(head + control + tail, custom_params=group)
            report = (backend.prefill(head + paraphrase + tail, custom_params=group).get(ASKS_KEY) or [{}])[0]
            # A pair is probed when the control was a candidate donor at all: a paraphrase whose
            # span starts after words it shares with other paraphrases ("You are a ...") cannot
            # take a control that does not share them, whatever the gate says.
            if report.get("sigma") is not None:
                sigmas[kind].append(report["sigma"])
                accepted[kind] += bool(report.get("adopted"))

    def rate(hits: int, n: int) -> float | None:
        return round(hits / n, 4) if n else None

    same = [k for k in sigmas if k != "topic"]
    same_sigmas = [x for k in same for x in sigmas[k]]
    same_pairs = sum(len(f.texts) for f in EVAL_CONTROLS) * len(EVAL.paraphrases)
    return {"asks_control_pairs": len(EVAL.controls) * len(EVAL.paraphrases),
            "asks_control_probed": len(sigmas["topic"]),
            "asks_false_accept_rate": rate(accepted["topic"], len(sigmas["topic"])),
            "asks_control_sigma_max": round(max(sigmas["topic"]), 4) if sigmas["topic"] else None,
            "asks_same_topic_pairs": same_pairs, "asks_same_topic_probed": len(same_sigmas),
            "asks_same_topic_false_accepts": sum(accepted[k] for k in same),
            "asks_same_topic_false_accept_rate": rate(sum(accepted[k] for k in same), len(same_sigmas)),
            "asks_same_topic_false_accept_by_kind": {k: rate(accepted[k], len(sigmas[k])) for k in sorted(same)},
            "asks_same_topic_sigma_max": round(max(same_sigmas), 4) if same_sigmas else None}
