"""``verify``: pick the winner among a program's forked candidates, with confidence-gated early exit.

Level 1 (here, no request): each candidate's generation confidence and the skip rule of
``rksc_sgl.confidence``; a confident winner is accepted without verification. Otherwise every
candidate is scored by the verifier prompt, its own conversation followed by a user turn asking
whether the solution is correct, so the runtime's radix cache already holds all but that short
turn. The score is P(Yes) normalised over the Yes/No tokens of the first answer token, read from
one batched ``/generate`` request (``max_new_tokens=1``, greedy, ``token_ids_logprob``) sent
through the backend's own transport (``primitives.send_generate``), so ``RkscEngineEndpoint``,
``RkscEndpoint`` and SGLang's plain ``RuntimeEndpoint`` all work.

Level 2 (in the runtime, ``radix_ext.cgee.forward``): the request carries ``rksc_early_exit``
options and the forward stops at the first layer whose logit-lens entropy is low and stable.

A program whose stop rule already decided the vote over its candidates (``rksc_sgl.adaptive``)
passes ``vote_decided=True``: the vote's leader is accepted without verification, in either
mode, reported as ``skip_reason="vote"`` beside CGEE's ``"cgee"``.

Modes: ``"cgee"`` (both levels), ``"full"`` (every candidate verified at full depth; with
``lens=True`` the runtime also reports every layer's lens entropy and Yes/No log-probabilities,
which calibration replays the exit rule on). Verification requests are never inserted into the
radix tree, in either mode, so the two can be timed against each other in one run.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import time
from collections.abc import Hashable, Sequence
from typing import Any

from rksc_sgl.confidence import SkipDecision, answer_confidences, branch_confidence, skip_decision
from rksc_sgl.config import RkscConfig
from rksc_sgl.protocol import CGEE_KEY, EarlyExitParams

VERIFY_QUESTION = "Is the solution above correct? Answer Yes or No."
YES_WORDS = ("Yes", " Yes", "yes", " yes")
NO_WORDS = ("No", " No", "no", " no")
MODES = ("cgee", "full")


@dataclasses.dataclass(frozen=True)
class CgeeThresholds:
    tau_conf: float
    margin: float
    theta: float  # nats
    epsilon: float  # nats
    min_layer: int

    @classmethod
    def from_config(cls, config: RkscConfig | None = None) -> "CgeeThresholds":
        config = config or RkscConfig.from_env()
        return cls(config.cgee_tau_conf, config.cgee_margin, config.cgee_theta, config.cgee_epsilon,
                   config.cgee_min_layer)

    @classmethod
    def of_server(cls, backend) -> "CgeeThresholds":
        """The thresholds of the server (or engine) behind ``backend``: its ``--cgee-*`` flags, read
        once from its internal state (``/server_info``) and kept on the backend. A server that does
        not report them (stock SGLang, no plugin) gets ``RkscConfig``'s defaults."""
        cached = getattr(backend, "_rksc_cgee", None)
        if cached is None:
            states = backend.get_server_info().get("internal_states") or [{}]
            reported = states[0].get(CGEE_KEY)
            config = RkscConfig(**{f"cgee_{k}": v for k, v in reported.items()}) if reported else RkscConfig()
            cached = cls.from_config(config)
            backend._rksc_cgee = cached  # one assignment: safe for concurrent first calls
        return cached

    @classmethod
    def load(cls, path: str, dataset: str | None = None) -> "CgeeThresholds":
        """Read a file written by ``benchmarks.calibrate_cgee``: the thresholds calibrated on
        ``dataset`` alone if the file has them (``--per-dataset``), else the pooled ones. Every
        entry is validated like the flags (ValueError naming the flag), whichever is asked for."""
        with open(path) as f:
            calibration = json.load(f)
        entries = {None: calibration, **calibration.get("per_dataset", {})}
        loaded = {name: cls.from_config(RkscConfig(**{f"cgee_{k}": v for k, v in entry["thresholds"].items()}))
                  for name, entry in entries.items()}
        return loaded.get(dataset, loaded[None])

    def exit_params(self, lens_token_ids: Sequence[int] = ()) -> EarlyExitParams:
        return EarlyExitParams(theta=self.theta, epsilon=self.epsilon, min_layer=self.min_layer,
                               lens_token_ids=tuple(lens_token_ids))


@dataclasses.dataclass(frozen=True)
class Candidate:
    context: str  # the candidate's whole conversation so far, as the program's backend rendered it
    answer: Hashable | None  # what the candidate concludes (None if it concludes nothing)
    token_logprobs: tuple[float, ...]  # one per generated token


def token_logprobs(state, var_name: str) -> tuple[float, ...]:
    """The token log-probabilities of a program state's gen ``var_name`` (``return_logprob=True``)."""
    return tuple(entry[0] for entry in state.get_meta_info(var_name)["output_token_logprobs"])



@dataclasses.dataclass(frozen=True)
class VerifyResult:
    mode: str
    winner: int  # index of the chosen candidate
    answer: Hashable | None
    skipped: bool  # the winner was accepted without verification (why: ``skip_reason``)
    confidences: tuple[float, ...]  # per candidate: exp(mean token logprob)
    skip: SkipDecision
    scores: tuple[float, ...] | None = None  # per candidate P(Yes); None when skipped
    exit_layers: tuple[int | None, ...] | None = None  # per candidate, 1..num_layers
    entropies: tuple[tuple[float | None, ...] | None, ...] | None = None  # per candidate, per layer
    lens_scores: tuple[tuple[float | None, ...] | None, ...] | None = None  # per candidate, per layer P(Yes)
    layers_run: tuple[int | None, ...] | None = None  # per candidate: layers its forward batch ran
    verify_time_s: float = 0.0  # wall time of the verification request (0 when skipped)
    skip_reason: str | None = None  # "cgee" (level 1 was confident) or "vote" (the stop rule decided)

    @property
    def decision(self) -> Hashable:
        """What the program concludes: the winner's answer, or the winner itself if it has none."""
        return self.answer if self.answer is not None else f"#{self.winner}"


def verifier_prompt(backend, context: str) -> str:
    template = backend.chat_template
    user_prefix, user_suffix = template.get_prefix_and_suffix("user", [])
    assistant_prefix, _ = template.get_prefix_and_suffix("assistant", [])
    return f"{context}{user_prefix}{VERIFY_QUESTION}{user_suffix}{assistant_prefix}"


def verdict_token_ids(backend) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The single-token spellings of Yes and No in the backend's vocabulary."""
    cached = getattr(backend, "_rksc_verdict_ids", None)
    if cached is None:
        from rksc_sgl.primitives import token_ids  # imports SGLang's frontend: not for CgeeThresholds

        encoded = [[token_ids(backend, w) for w in words] for words in (YES_WORDS, NO_WORDS)]
        cached = tuple(tuple(sorted({ids[0] for ids in spellings if len(ids) == 1})) for spellings in encoded)
        if not all(cached):
            raise ValueError("the model's vocabulary has no single-token Yes/No; verify needs one")
        backend._rksc_verdict_ids = cached  # one assignment: safe for concurrent first calls
    return cached


def yes_probability(logprobs: dict[int, float], yes_ids: Sequence[int], no_ids: Sequence[int]) -> float:
    """P(Yes) / (P(Yes) + P(No)), summing each over its token spellings (logsumexp, stable)."""
    def lse(ids) -> float:
        values = [logprobs[i] for i in ids if logprobs.get(i) is not None]
        if not values:
            return -math.inf
        top = max(values)
        return top + math.log(sum(math.exp(v - top) for v in values))

    yes, no = lse(yes_ids), lse(no_ids)
    if yes == no:  # includes both absent
        return 0.5
    return 1.0 / (1.0 + math.exp(min(no - yes, 700.0)))


def _level1(candidates: Sequence[Candidate], thresholds: CgeeThresholds):
    confidences = tuple(branch_confidence(c.token_logprobs) for c in candidates)
    decision = skip_decision(answer_confidences([c.answer for c in candidates], confidences),
                             thresholds.tau_conf, thresholds.margin)
    return confidences, decision


def _most_confident(candidates: Sequence[Candidate], answer: Hashable | None, confidences: Sequence[float]) -> int:
    return max((i for i, c in enumerate(candidates) if c.answer == answer), key=lambda i: confidences[i])


def verify(backend, candidates: Sequence[Candidate], *, mode: str = "cgee",
           thresholds: CgeeThresholds | None = None, lens: bool = False, vote_decided: bool = False) -> VerifyResult:
    """Choose the winner among ``candidates`` (see the module docstring for the modes).

    ``thresholds`` default to the server's (its ``--cgee-*`` flags, ``CgeeThresholds.of_server``);
    a program passes its own to override them (``CgeeThresholds.load`` reads a calibration file).
    ``lens`` (mode "full") asks for every layer's lens diagnostics.
    ``vote_decided``: the program's stop rule decided the vote; its leader (the most frequent
    answer, ties to the first seen) wins unverified, through its most confident candidate.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if not candidates:
        raise ValueError("verify needs at least one candidate")
    if thresholds is None:  # no backend: a decided vote, whose level-1 decision is only reported
        thresholds = CgeeThresholds.from_config() if backend is None else CgeeThresholds.of_server(backend)
    confidences, decision = _level1(candidates, thresholds)
    votes = collections.Counter(c.answer for c in candidates if c.answer is not None)
    if vote_decided and votes:
        leader = next(c.answer for c in candidates if votes.get(c.answer) == max(votes.values()))
        winner = _most_confident(candidates, leader, confidences)
        return VerifyResult(mode, winner, leader, True, confidences, decision, skip_reason="vote")
    if mode == "cgee" and decision.skip:
        winner = _most_confident(candidates, decision.winner, confidences)
        return VerifyResult(mode, winner, candidates[winner].answer, True, confidences, decision, skip_reason="cgee")

    yes_ids, no_ids = verdict_token_ids(backend)
    verdict_ids = yes_ids + no_ids
    if mode == "cgee":
        params = thresholds.exit_params()
    else:
        params = EarlyExitParams(full_depth=True, lens=lens, lens_token_ids=verdict_ids if lens else ())
    body = {
        "text": [verifier_prompt(backend, c.context) for c in candidates],
        "sampling_params": {"max_new_tokens": 1, "temperature": 0, "custom_params": params.to_custom_params()},
        "return_logprob": True,
        "token_ids_logprob": list(verdict_ids),
    }
    start = time.perf_counter()
    from rksc_sgl.primitives import send_generate

    outputs = send_generate(backend, body)
    elapsed = time.perf_counter() - start
    metas = [o["meta_info"] for o in (outputs if isinstance(outputs, list) else [outputs])]

    def first(meta: dict[str, Any], key: str):
        value = meta.get(key)
        return value[0] if value else None

    scores = tuple(
        yes_probability({i: lp for lp, i, *_ in m["output_token_ids_logprobs"][0]}, yes_ids, no_ids) for m in metas
    )
    lens_scores = None
    if any(first(m, "rksc_lens_logprobs") for m in metas):
        lens_scores = tuple(
            tuple(None if lps is None else yes_probability(dict(zip(verdict_ids, lps)), yes_ids, no_ids)
                  for lps in first(m, "rksc_lens_logprobs"))
            if first(m, "rksc_lens_logprobs") else None
            for m in metas
        )
    winner = max(range(len(candidates)), key=lambda i: (scores[i], -i))
    return VerifyResult(
        mode, winner, candidates[winner].answer, False, confidences, decision, scores,
        exit_layers=tuple(first(m, "rksc_exit_layer") for m in metas),
        entropies=tuple(None if first(m, "rksc_entropies") is None else tuple(first(m, "rksc_entropies"))
                        for m in metas),
        lens_scores=lens_scores,
        layers_run=tuple(first(m, "rksc_layers_run") for m in metas),
        verify_time_s=elapsed,
    )
