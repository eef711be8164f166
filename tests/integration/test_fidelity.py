"""``benchmarks.fidelity`` reads SGLang's input logprobs: pinned on the real engine."""

from __future__ import annotations

import pytest

from benchmarks.perf.fidelity import compare, read

pytestmark = pytest.mark.integration

COUNTING = "Count: " + ", ".join(str(i) for i in range(1, 40))


class Engine:
    """``engine.generate``'s call, on the session endpoint's own event loop."""

    def __init__(self, backend):
        self.backend = backend

    def generate(self, **kwargs):
        return self.backend.run(self.backend.engine.async_generate(**kwargs))


def test_each_position_reads_the_token_that_follows_it(engine_backend):
    engine = Engine(engine_backend)
    tokens = engine_backend.engine.tokenizer_manager.tokenizer.encode(COUNTING)
    (logprobs, tops), (short, _) = read(engine, [COUNTING, "Question: 1 + 1?\nAnswer: 2"])
    assert len(logprobs) == len(tokens) - 1 and len(short) > 0
    # Counting is predictable: past the first numbers the top token is the text's next one, and
    # there its log-probability is the top one's. Read one position off, almost none would be.
    late = list(range(len(tokens) // 2, len(tokens) - 1))
    hits = [i for i in late if tops[i] == tokens[i + 1]]
    assert len(hits) > 0.8 * len(late)
    assert all(logprobs[i] > -0.7 for i in hits)


def test_a_second_reading_of_a_text_is_the_first(engine_backend):
    engine = Engine(engine_backend)
    first, second = read(engine, [COUNTING]), read(engine, [COUNTING])
    assert first == second
    assert compare(second, first)["mean_abs_logprob_difference"] == 0.0
