"""The DSPy example (``programs/agent_dspy.py``, run in ``.venv-front`` where DSPy lives) against
the server's OpenAI-compatible API: the program completes, its branches find their shared prompt in
the radix cache, the OpenAI ``seed`` makes a branch reproducible, and a bad rksc option sent in
``extra_body`` comes back as the server's 4xx reason."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
FRONT_PYTHON = ROOT / ".venv-front" / "bin" / "python"


def agent(url: str, *args: str) -> subprocess.CompletedProcess:
    assert FRONT_PYTHON.is_file(), "DSPy lives in .venv-front: run `make front`"
    return subprocess.run([str(FRONT_PYTHON), "-m", "programs.agent_dspy", "--url", url, "--json", *args],
                          capture_output=True, text=True, timeout=900, cwd=ROOT)


def test_dspy_branches_complete_and_reuse_their_prompt(server_url):
    run = agent(server_url, "--questions", "1", "--branches", "3", "--max-tokens", "48")
    assert run.returncode == 0, run.stderr[-2000:]
    question = json.loads(run.stdout)["questions"][0]
    assert len(question["answers"]) == 3
    calls = question["calls"]
    assert len(calls) >= 3 and all(c["prompt_tokens"] for c in calls)
    # The branches send the same prompt (and, when a 135M model breaks DSPy's output format, the
    # same JSON-adapter retry prompt): after the first call the radix cache serves most of it.
    later = calls[1:]
    assert sum(c["cached_tokens"] for c in later) >= 0.7 * sum(c["prompt_tokens"] for c in later), calls


def test_the_openai_seed_makes_a_dspy_branch_reproducible(server_url):
    runs = [agent(server_url, "--questions", "1", "--branches", "1", "--seed", "7", "--max-tokens", "48")
            for _ in range(2)]
    assert all(r.returncode == 0 for r in runs), runs[0].stderr[-2000:]
    first, second = (json.loads(r.stdout)["questions"][0] for r in runs)
    assert [c["output"] for c in first["calls"]] == [c["output"] for c in second["calls"]]
    assert first["answers"] == second["answers"]


def test_a_bad_rksc_option_in_extra_body_comes_back_as_the_servers_reason(server_url):
    run = agent(server_url, "--questions", "1", "--branches", "1",
                "--extra-body", '{"custom_params": {"rksc": {"depth": -1}}}')
    assert run.returncode == 0  # the program reports the failed branch and goes on
    assert json.loads(run.stdout)["questions"][0]["answers"] == [None]
    assert "BadRequestError" in run.stderr and "custom_params.rksc.depth" in run.stderr, run.stderr[-2000:]
