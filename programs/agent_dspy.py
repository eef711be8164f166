"""A DSPy program as a client of rksc-sgl: self-consistency through the OpenAI-compatible API.

    .venv-front/bin/python -m programs.agent_dspy --url http://127.0.0.1:30000 --branches 4

DSPy (with its own dependencies, in the ``.venv-front`` venv that ``make front`` builds) points its
``dspy.LM`` at the server's ``/v1`` endpoint like at any OpenAI-compatible provider. Each question
runs ``--branches`` chain-of-thought calls, branch ``b`` with the OpenAI ``seed`` ``seed + b`` (our
runtime's seeded sampler honours it, stock SGLang ignores it) and rksc-sgl's per-request options in
``extra_body`` (here the branch's RSBCM depth and score; see the README's "per-request options").
The branches share their prompt, so the server's radix cache serves it after the first one: the
report shows the prompt tokens each call found cached. The answer is the branches' majority.
``--asks-group G`` sends every call with the routing key ``rksc-asks:G`` (an ASKS group: a server
with ``--asks`` lets the calls reuse each other's KV after other openings, and sglang-router keeps
them on one worker; see docs/serving.md, "Agent frameworks"), and the report adds each call's
ASKS decision, which litellm (under ``dspy.LM``) keeps in ``provider_specific_fields``.

Standalone on purpose: it imports DSPy and the standard library only, as an agent framework's code
would. ``--json`` prints the report as one JSON object.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys

QUESTIONS = (
    "Tom has 3 boxes with 4 apples in each box. How many apples does he have?",
    "A train travels 60 miles per hour for 2 hours. How many miles does it travel?",
    "Sara had 10 pencils and gave away 4. How many pencils does she have left?",
)


def build(url: str, max_tokens: int, temperature: float):
    # litellm (under dspy.LM) otherwise fetches a model price list from the internet at import.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import dspy

    lm = dspy.LM("openai/default", api_base=url.rstrip("/") + "/v1", api_key="none", model_type="chat",
                 temperature=temperature, max_tokens=max_tokens, cache=False, num_retries=0)
    dspy.configure(lm=lm)

    class Solve(dspy.Signature):
        """Solve the arithmetic word problem. Give the answer as a number."""

        question: str = dspy.InputField()
        answer: str = dspy.OutputField(desc="a number")

    return lm, dspy.ChainOfThought(Solve)


def solve(program, lm, question: str, branches: int, seed: int, options: dict, headers: dict | None = None) -> dict:
    """``branches`` seeded calls on one question; their answers, the majority, and cache use."""
    answers, calls = [], []
    for b in range(branches):
        before = len(lm.history)
        try:
            config = {"seed": seed + b, "extra_body": options, **({"extra_headers": headers} if headers else {})}
            pred = program(question=question, config=config)
            answers.append(str(pred.answer).strip())
        except Exception as e:  # a 135M model does not always keep DSPy's output format
            answers.append(None)
            print(f"branch {b}: {type(e).__name__}: {str(e)[:200]}", file=sys.stderr)
        for entry in lm.history[before:]:
            usage = entry.get("usage") or {}
            details = usage.get("prompt_tokens_details") or {}
            outputs = entry.get("outputs") or [None]
            call = {"prompt_tokens": usage.get("prompt_tokens"), "cached_tokens": details.get("cached_tokens"),
                    "output": outputs[0] if isinstance(outputs[0], str) else str(outputs[0])}
            asks = asks_report(entry.get("response"))
            calls.append(call if asks is None else {**call, "asks": asks})
    votes = collections.Counter(a for a in answers if a)
    return {"question": question, "answers": answers, "majority": votes.most_common(1)[0][0] if votes else None,
            "calls": calls}


def asks_report(response) -> dict | None:
    """A call's ASKS decision (the server's ``rksc_asks`` on the choice), if it has one."""
    choices = getattr(response, "choices", None) or [None]
    fields = getattr(choices[0], "provider_specific_fields", None) or {}
    return fields.get("rksc_asks")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m programs.agent_dspy", description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:30000", help="the rksc-sgl server (or router)")
    p.add_argument("--branches", type=int, default=4)
    p.add_argument("--questions", type=int, default=len(QUESTIONS), help=f"at most {len(QUESTIONS)}")
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--extra-body", default='{"custom_params": {"rksc": {"depth": 1, "score": 0.5}}}',
                   help="JSON object sent as every call's extra_body (default: %(default)s)")
    p.add_argument("--asks-group", default=None,
                   help="an ASKS group for every call, sent as the routing key rksc-asks:<group>")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    args = p.parse_args(argv)
    if args.branches < 1 or not 1 <= args.questions <= len(QUESTIONS):
        p.error(f"--branches must be >= 1 and --questions in [1, {len(QUESTIONS)}]")
    try:
        options = json.loads(args.extra_body)
    except json.JSONDecodeError as e:
        p.error(f"--extra-body is not JSON: {e}")
    if not isinstance(options, dict):
        p.error("--extra-body must be a JSON object")

    lm, program = build(args.url, args.max_tokens, args.temperature)
    # The ASKS group in sglang-router's routing-key header (rksc_sgl.protocol.asks_routing_key, not
    # imported: this program needs DSPy only): the one place a chat request's group passes the router.
    headers = {"X-SMG-Routing-Key": f"rksc-asks:{args.asks_group}"} if args.asks_group else None
    report = [solve(program, lm, q, args.branches, args.seed, options, headers) for q in QUESTIONS[:args.questions]]
    if args.json:
        print(json.dumps({"questions": report}))
    else:
        for r in report:
            hits = [c["cached_tokens"] for c in r["calls"]]
            print(f"{r['question']}\n  branches {r['answers']} -> {r['majority']}; cached prompt tokens per call {hits}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
