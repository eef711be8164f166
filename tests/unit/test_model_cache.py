"""The default-model cache: one conversion under concurrency, never a half-written folder.

A fake converter stands in for the real GGUF conversion (which takes ~20 s), and a small fake file
for the GGUF, so these run in about a second.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import time
from pathlib import Path

import pytest

from rksc_sgl import model_cache


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """An empty cache folder and a fake source GGUF; forked children inherit both."""
    monkeypatch.setenv("RKSC_SGL_CACHE", str(tmp_path / "cache"))
    source = tmp_path / "fake.gguf"
    source.write_bytes(b"GGUF fake weights")
    monkeypatch.setattr(model_cache, "source_gguf", lambda: source)
    return tmp_path / "cache"


def _target(cache: Path) -> Path:
    return cache / "models" / model_cache.MODEL_NAME


def _slow_fake_convert(source: Path, out_dir: Path) -> None:
    """Log one line per conversion, and whether the final folder was visible meanwhile."""
    visible = _target(Path(os.environ["RKSC_SGL_CACHE"])).exists()
    with open(Path(os.environ["RKSC_SGL_CACHE"]) / "conversions.log", "a") as log:
        log.write(f"pid={os.getpid()} final_folder_visible={visible}\n")
    (out_dir / "config.json").write_text("{}")
    time.sleep(0.5)  # long enough for the other process to reach the lock
    (out_dir / "model.safetensors").write_bytes(source.read_bytes())


def _race(start, results) -> None:
    start.wait()
    results.put(str(model_cache.default_model_path(convert=_slow_fake_convert)))


class TestConcurrentFirstUse:
    def test_two_racing_processes_convert_exactly_once(self, cache):
        ctx = multiprocessing.get_context("fork")  # children inherit the monkeypatched source
        start, results = ctx.Barrier(2), ctx.Queue()
        procs = [ctx.Process(target=_race, args=(start, results)) for _ in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=30)
        assert [p.exitcode for p in procs] == [0, 0]

        paths = {results.get(timeout=5) for _ in procs}
        log_lines = (cache / "conversions.log").read_text().splitlines()
        assert len(log_lines) == 1
        assert "final_folder_visible=False" in log_lines[0]
        assert paths == {str(_target(cache))}
        assert (_target(cache) / model_cache.MARKER).is_file()
        assert (_target(cache) / "model.safetensors").read_bytes() == b"GGUF fake weights"

    def test_leaves_no_temporary_folder_behind(self, cache):
        model_cache.default_model_path(convert=_slow_fake_convert)

        assert sorted(p.name for p in (cache / "models").iterdir()) == [model_cache.MODEL_NAME]


class TestCompleteness:
    def test_complete_folder_is_reused_without_converting(self, cache):
        first = model_cache.default_model_path(convert=_slow_fake_convert)

        def must_not_run(source, out_dir):
            raise AssertionError("converted again")

        assert model_cache.default_model_path(convert=must_not_run) == first

    def test_folder_without_marker_is_converted_again(self, cache):
        _target(cache).mkdir(parents=True)
        (_target(cache) / "config.json").write_text("half-written")

        path = model_cache.default_model_path(convert=_slow_fake_convert)

        assert (path / model_cache.MARKER).is_file()
        assert (path / "config.json").read_text() == "{}"

    def test_failed_conversion_leaves_nothing_and_a_retry_succeeds(self, cache):
        def broken(source, out_dir):
            (out_dir / "config.json").write_text("{}")
            raise RuntimeError("disk full")

        with pytest.raises(RuntimeError, match="disk full"):
            model_cache.default_model_path(convert=broken)
        assert list((cache / "models").iterdir()) == []
        assert model_cache.default_model_path(convert=_slow_fake_convert) == _target(cache)

    def test_marker_records_source_size_and_sha256(self, cache):
        path = model_cache.default_model_path(convert=_slow_fake_convert)

        marker = (path / model_cache.MARKER).read_text()
        assert '"size_bytes": 17' in marker and '"sha256": "' in marker


class TestCacheDir:
    def test_env_override_wins(self, monkeypatch, tmp_path):
        monkeypatch.setenv("RKSC_SGL_CACHE", str(tmp_path / "mine"))
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
        assert model_cache.cache_dir() == tmp_path / "mine"

    def test_xdg_cache_home_then_home(self, monkeypatch, tmp_path):
        monkeypatch.delenv("RKSC_SGL_CACHE", raising=False)
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
        assert model_cache.cache_dir() == tmp_path / "xdg" / "rksc-sgl"
        monkeypatch.delenv("XDG_CACHE_HOME")
        assert model_cache.cache_dir() == Path.home() / ".cache" / "rksc-sgl"


class TestResolveModelPath:
    def test_existing_local_folder_is_returned(self, tmp_path):
        assert model_cache.resolve_model_path(str(tmp_path)) == str(tmp_path)

    def test_hub_id_is_rejected_naming_the_flag(self):
        with pytest.raises(ValueError, match="--model-path.*only local model folders"):
            model_cache.resolve_model_path("HuggingFaceTB/SmolLM2-135M-Instruct")


class TestOneGgufParse:
    """The conversion parses the GGUF once: transformers asks for a reader three times."""

    @pytest.fixture
    def tiny_gguf(self, tmp_path) -> Path:
        gguf = pytest.importorskip("gguf")
        path = tmp_path / "tiny.gguf"
        writer = gguf.GGUFWriter(str(path), "llama")
        writer.add_uint32("tiny.answer", 42)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.close()
        return path

    def test_readers_are_shared_inside_and_fresh_outside(self, tiny_gguf):
        import gguf

        original = gguf.GGUFReader
        with model_cache._gguf_parsed_once():
            from gguf import GGUFReader  # how transformers imports it, inside its function

            first, again = GGUFReader(tiny_gguf), GGUFReader(str(tiny_gguf))
            assert first is again
            assert first.fields["tiny.answer"].contents() == 42
        assert gguf.GGUFReader is original
        assert original(tiny_gguf) is not first

    def test_transformers_gguf_loader_reads_through_the_shared_reader(self, tiny_gguf, monkeypatch):
        # Pins the seam: transformers imports ``GGUFReader`` from ``gguf`` inside its loader, at
        # call time. Were it bound at import, the conversion would parse the GGUF four times again.
        import gguf
        from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

        built = []
        real = gguf.GGUFReader
        monkeypatch.setattr(gguf, "GGUFReader", lambda *a, **kw: built.append(a) or real(*a, **kw))
        with model_cache._gguf_parsed_once():
            for _ in range(2):
                with contextlib.suppress(Exception):  # the tiny file has no model in it
                    load_gguf_checkpoint(str(tiny_gguf))
        assert len(built) == 1

    def test_the_original_reader_is_restored_after_an_error(self, tiny_gguf):
        import gguf

        original = gguf.GGUFReader
        with pytest.raises(RuntimeError), model_cache._gguf_parsed_once():
            raise RuntimeError("conversion failed")
        assert gguf.GGUFReader is original
