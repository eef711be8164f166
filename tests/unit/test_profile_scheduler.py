"""The scheduler profile's pure parts: py-spy's collapsed stacks, their categories, the flags."""

import pytest

from benchmarks.perf import profile_scheduler as prof

SP = "/x/site-packages"
RAW = "\n".join([
    f"run (scheduler.py:1);Scheduler.event_loop_overlap (s.py:2);event_loop ({SP}/sglang/srt/managers/scheduler.py:9);match_prefix ({SP}/sglang/srt/mem_cache/radix_cache.py:300) 30",
    f"run (scheduler.py:1);Scheduler.event_loop_overlap (s.py:2);evict (/repo/radix_ext/eviction/backend.py:80);get_priority (/repo/radix_ext/eviction/policy.py:40) 10",
    f"run (scheduler.py:1);Scheduler.event_loop_overlap (s.py:2);forward ({SP}/sglang/srt/model_executor/model_runner.py:5);linear ({SP}/torch/nn/functional.py:1) 50",
    f"run (scheduler.py:1);Scheduler.event_loop_overlap (s.py:2);_after_batch (/repo/radix_ext/stop/stopper.py:200) 5",
    f"run (s.py:1);Scheduler.event_loop_overlap (s.py:2);forward ({SP}/sglang/srt/model_executor/m.py:5);set_kv_buffer ({SP}/sglang/srt/mem_cache/memory_pool.py:9) 7",
    f"run (scheduler.py:1);Scheduler.event_loop_overlap (s.py:2);forward ({SP}/sglang/srt/model_executor/model_runner.py:5);sample ({SP}/sglang/srt/layers/sampler.py:7) 3",
    f"run (scheduler.py:1);Scheduler.event_loop_overlap (s.py:2);recv_requests ({SP}/sglang/srt/managers/scheduler.py:50);cat ({SP}/torch/functional.py:3) 2",
    f"run (scheduler.py:1);load_model ({SP}/sglang/srt/model_executor/model_runner.py:9) 400",
    "garbage line without a count",
])


def test_each_stack_goes_to_the_first_category_any_of_its_frames_matches():
    stacks = prof.parse_collapsed(RAW)
    assert len(stacks) == 8 and stacks[0][1] == 30
    assert [prof.categorize(s) for s, _ in stacks] == [
        "radix cache", "radix cache", "model forward", "rksc hooks", "model forward", "sampling", prof.OTHER,
        "model forward"]


def test_the_summary_counts_the_event_loops_seconds_and_the_caches_busiest_frames():
    summary = prof.summarize(prof.parse_collapsed(RAW), rate=10)
    assert summary["samples"] == 107 and summary["seconds"] == 10.7
    assert summary["seconds_by_category"] == {"model forward": 5.7, "radix cache": 4.0, "rksc hooks": 0.5,
                                              "sampling": 0.3, prof.OTHER: 0.2}
    assert summary["share_by_category"]["radix cache"] == round(40 / 107, 4)
    assert [f["seconds"] for f in summary["top_cache_frames"]] == [3.0, 1.0]
    assert "eviction/policy.py" in summary["top_cache_frames"][1]["frame"]


def test_the_forward_splits_into_decode_blend_and_prefill():
    loop = f"run (s.py:1);Scheduler.event_loop_normal (s.py:2);forward ({SP}/sglang/srt/model_executor/model_runner.py:5)"
    hook = "lean_decode (/repo/radix_ext/cpu/decode.py:170)"  # the hook is on every forward's stack
    raw = "\n".join([
        f"{loop};{hook};_decode (/repo/radix_ext/cpu/decode.py:190);linear ({SP}/torch/nn/functional.py:1) 6",
        f"{loop};{hook};blend_forward (/repo/radix_ext/asks/blend.py:250);mm ({SP}/torch/x.py:1) 3",
        f"{loop};{hook};LlamaForCausalLM.forward ({SP}/sglang/srt/models/llama.py:9) 4",
        f"{loop};RkscCpuAttnBackend.forward_decode (/repo/radix_ext/cpu/attention.py:240) 1",
    ])
    summary = prof.summarize(prof.parse_collapsed(raw), rate=1)
    assert summary["seconds_by_category"] == {"model forward": 14}
    assert summary["forward_seconds_by_kind"] == {"decode": 7, "prefill": 4, "ASKS blend": 3}


@pytest.mark.parametrize("argv, flag", [(["--limit", "0"], "--limit"), (["--rate", "0"], "--rate"),
                                        (["--modes", "exact,bogus"], "--modes")])
def test_a_bad_value_names_its_flag(argv, flag, capsys):
    with pytest.raises(SystemExit) as exc:
        prof.parse_args(argv)
    assert exc.value.code == 2 and flag in capsys.readouterr().err
