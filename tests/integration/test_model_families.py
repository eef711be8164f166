"""The mechanisms that touch the forward work on the paper's model families, not only SmolLM2.

SGLang runs Llama-3, Mistral and Falcon3 with its Llama classes and Qwen2.5 with
``Qwen2ForCausalLM``. Each test builds a tiny random-weight checkpoint of one architecture with
transformers, locally (no hub; SmolLM2's tokenizer), starts the real engine on it, and checks:
a verification request that runs full depth computes exactly what a plain request computes; an
early-exit request really stops at its exit layer; seeded sampling repeats itself; the KV pool
balances afterwards.
"""

from __future__ import annotations

import shutil

import pytest

from rksc_sgl.protocol import EarlyExitParams
from tests.integration.kv import assert_no_kv_leak

pytestmark = pytest.mark.integration

NUM_LAYERS = 4
PROMPT = "The quick brown fox jumps over the lazy dog. Is that sentence correct? Answer:"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")


def tiny_checkpoint(architecture: str, folder) -> str:
    """A random-weight ``architecture`` ("llama" or "qwen2") checkpoint in ``folder``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    from rksc_sgl.model_cache import default_model_path

    common = dict(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=NUM_LAYERS,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                  bos_token_id=1, eos_token_id=2, pad_token_id=2, tie_word_embeddings=False)
    config, model_class = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}[architecture]
    torch.manual_seed(0)
    model = model_class(config(**common)).to(torch.float32)
    model.save_pretrained(folder)
    source = default_model_path()
    for name in TOKENIZER_FILES:
        if (source / name).exists():
            shutil.copy(source / name, folder / name)
    return str(folder)


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def family(request, tmp_path_factory):
    from rksc_sgl.engine import launch_engine
    from rksc_sgl.engine_endpoint import RkscEngineEndpoint

    path = tiny_checkpoint(request.param, tmp_path_factory.mktemp(request.param))
    backend = RkscEngineEndpoint(launch_engine(path, max_total_tokens=4096, log_level="error"))
    yield request.param, backend
    backend.shutdown()


def generate(backend, sampling: dict) -> dict:
    body = {"text": PROMPT, "sampling_params": sampling, "return_logprob": True, "top_logprobs_num": 5}
    return backend._generate_http_request(None, body)


def flagged(params: EarlyExitParams) -> dict:
    return {"max_new_tokens": 1, "temperature": 0, "custom_params": params.to_custom_params()}


def meta(out: dict, key: str):
    value = out["meta_info"].get(key)
    return value[0] if value else None


class TestModelFamilies:
    def test_full_depth_verification_computes_what_a_plain_request_computes(self, family):
        name, backend = family
        backend.flush_cache()
        plain = generate(backend, {"max_new_tokens": 1, "temperature": 0})
        backend.flush_cache()
        lens = generate(backend, flagged(EarlyExitParams(full_depth=True)))
        assert meta(lens, "rksc_exit_layer") == NUM_LAYERS, name
        assert len([e for e in meta(lens, "rksc_entropies") if e is not None]) == NUM_LAYERS
        assert lens["meta_info"]["output_token_logprobs"] == plain["meta_info"]["output_token_logprobs"]
        assert lens["meta_info"]["output_top_logprobs"] == plain["meta_info"]["output_top_logprobs"]

    def test_an_early_exit_stops_at_its_exit_layer(self, family):
        name, backend = family
        out = generate(backend, flagged(EarlyExitParams(theta=1e6, epsilon=1e6, min_layer=2)))
        assert meta(out, "rksc_exit_layer") == 2, name  # not a silent full-depth pass
        assert meta(out, "rksc_layers_run") == 2
        assert_no_kv_leak(backend)

    def test_seeded_sampling_repeats_itself(self, family):
        name, backend = family
        params = {"max_new_tokens": 12, "temperature": 1.0, "ignore_eos": True, "sampling_seed": 77}
        first, second = generate(backend, params), generate(backend, params)  # the second hits the cache
        ids = lambda out: [t[1] for t in out["meta_info"]["output_token_logprobs"]]  # noqa: E731
        assert len(ids(first)) == 12 and ids(first) == ids(second), name
        assert_no_kv_leak(backend)
