"""``python -m benchmarks.soak``: mixed traffic against one server for a long time; what stays bounded.

    python -m benchmarks.soak                      # 30 minutes
    python -m benchmarks.soak --duration-s 120     # a smoke run

Starts one ``rksc_sgl.launch_server`` (``--server-args``: RSBCM and ASKS on, a small pool, a 1 MB
signature cap that the run reaches) and runs
``--clients`` client threads until ``--duration-s`` has passed. Each thread picks its next action at
random (seeded, ``--seed``) from the mix:

* ``program``: a self-consistency program (``programs.sc``) of 4 seeded forks through ``RkscEndpoint``;
* ``paraphrase``: a paraphrase program (``programs.paraphrase_sc``): ASKS span commits under a
  fresh substitution group, then 4 forks that may adopt branch 0's wording;
* ``adaptive``: an OpenAI ``/v1/completions`` request with ``n = 4`` and a group stop policy;
* ``walkaway``: a streamed ``n = 4`` request dropped after its first chunk, or a request whose client
  gives up after a second (either way SGLang must abort it and free its KV);
* ``bad``: a request that must get a 4xx (the three of issue 22, and others).

Every ``--sample-every-s`` seconds a sampler records the server process tree's resident memory
(in all, and per process: resident and anonymous), the
KV pool (tokens held by running requests, evictable, free; requests queued and running) and the ASKS
signature bytes the tree holds. At the end the pool must settle and the server still serve.

The verdict (``ok``): every action accounted for (none hung past ``--action-timeout-s``, no
unexpected error), every bad request a 4xx, the pool settled, signature bytes within the server's cap,
and resident memory flat after ``--warmup-s``: its growth from the first sample after warm-up to
the largest after it at most ``--rss-growth-mb``. One JSON record (with every sample) is appended to
``benchmarks/results/soak.jsonl``; a plot of the samples is written beside it.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import random
import shlex
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import requests

from benchmarks.bench.records import MODEL_NAME, append_jsonl, git_commit, machine
from rksc_sgl import servers
from rksc_sgl.protocol import STATS_KEY

RESULTS = Path("benchmarks/results/soak.jsonl")
DEFAULT_SERVER_ARGS = "--rsbcm --asks --asks-signature-cap-mb 1 --max-total-tokens 8000 --log-level warning"
MIX = {"program": 3, "paraphrase": 2, "adaptive": 2, "walkaway": 2, "bad": 2}
# Each must get a 4xx and leave the server serving (tests/integration/test_http_fuzz.py has them all).
BAD = [
    ("/generate", {"text": "hi", "return_logprob": True, "top_logprobs_num": 100000,
                   "sampling_params": {"max_new_tokens": 4}}),
    ("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 4, "n": 100000}}),
    ("/generate", {"text": "hi", "custom_params": {"rksc": {"depth": 1}}, "sampling_params": {"max_new_tokens": 4}}),
    ("/generate", {"text": ""}),
    ("/generate", {"text": "hi", "sampling_params": {"custom_params": {"rksc_conf_stop": {"window": 0}}}}),
    ("/v1/completions", {"model": "default", "prompt": "hi", "max_tokens": 2, "logprobs": 100000}),
    ("/v1/chat/completions", {"model": "default", "messages": []}),
]


@dataclasses.dataclass(frozen=True)
class SoakSettings:
    duration_s: float = 1800.0
    clients: int = 4
    sample_every_s: float = 10.0
    warmup_s: float = 300.0
    rss_growth_mb: float = 150.0
    action_timeout_s: float = 300.0
    max_new_tokens: int = 32
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("duration_s", "clients", "sample_every_s", "action_timeout_s", "max_new_tokens"):
            if getattr(self, name) <= 0:
                raise ValueError(f"--{name.replace('_', '-')} must be > 0, got {getattr(self, name)}")
        for name in ("warmup_s", "rss_growth_mb"):
            if getattr(self, name) < 0:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(self, name)}")
        if self.warmup_s >= self.duration_s:
            raise ValueError(f"--warmup-s ({self.warmup_s}) must be less than --duration-s ({self.duration_s})")


class Traffic:
    """The client actions; each returns its outcome: ``ok``, ``refused`` (the 4xx a bad request
    must get) or ``error: ...`` (anything else)."""

    def __init__(self, url: str, settings: SoakSettings, questions: list[str]) -> None:
        self.url, self.settings, self.questions = url, settings, questions

    def program(self, rng: random.Random) -> str:
        from programs.sc import sc_program
        from rksc_sgl.endpoint import RkscEndpoint

        state = sc_program.run(rng.choice(self.questions), 4, self.settings.max_new_tokens, 0.7,
                               [rng.randrange(2**62) for _ in range(4)], backend=RkscEndpoint(self.url))
        return "ok" if state.error() is None else f"error: {state.error()}"

    def paraphrase(self, rng: random.Random) -> str:
        from programs.paraphrase_sc import paraphrase_program
        from programs.paraphrases import EVAL
        from rksc_sgl.endpoint import RkscEndpoint

        systems = rng.sample(list(EVAL.paraphrases), 4)
        state = paraphrase_program.run(systems=systems, prompt=rng.choice(self.questions),
                                       gen_tokens=self.settings.max_new_tokens, gen_temperature=0.7,
                                       seeds=[rng.randrange(2**62) for _ in range(4)], group=uuid.uuid4().hex,
                                       backend=RkscEndpoint(self.url))
        return "ok" if state.error() is None else f"error: {state.error()}"

    def adaptive(self, rng: random.Random) -> str:
        policy = {"answer_pattern": r"answer is (\d+)", "rule": "beta", "confidence": 0.9}
        res = requests.post(self.url + "/v1/completions", timeout=self.settings.action_timeout_s, json={
            "model": "default", "prompt": rng.choice(self.questions), "n": 4, "seed": rng.randrange(2**31),
            "max_tokens": self.settings.max_new_tokens, "temperature": 0.7,
            "custom_params": {"rksc_group_policy": policy}})
        return "ok" if res.status_code == 200 else f"error: HTTP {res.status_code} {res.text[:120]}"

    def walkaway(self, rng: random.Random) -> str:
        body = {"text": rng.choice(self.questions),
                "sampling_params": {"max_new_tokens": 512, "ignore_eos": True, "temperature": 0.7, "n": 4}}
        if rng.random() < 0.5:  # a stream dropped after its first chunk
            with requests.post(self.url + "/generate", json={**body, "stream": True}, stream=True,
                               timeout=self.settings.action_timeout_s) as res:
                if res.status_code != 200:
                    return f"error: HTTP {res.status_code}"
                next(res.iter_lines(), None)
            return "ok"
        try:  # a client that gives up after a second
            requests.post(self.url + "/generate", json=body, timeout=1.0)
        except requests.Timeout:
            return "ok"
        return "ok"  # answered within a second: nothing walked away, nothing wrong either

    def bad(self, rng: random.Random) -> str:
        route, body = rng.choice(BAD)
        res = requests.post(self.url + route, json=body, timeout=self.settings.action_timeout_s)
        return "refused" if 400 <= res.status_code < 500 else f"error: HTTP {res.status_code} for {route} {body}"


def process_tree_memory(pid: int) -> tuple[float, dict[str, dict[str, float]]]:
    """The server process tree's resident memory (MB), and per process, by its role (its process
    title: ``sglang::scheduler``, ``sglang::detokenizer``; the launcher, which also runs the HTTP
    server and the tokenizer, is ``server``), its resident and anonymous memory (``RssAnon``: the
    heap and what the process allocated, where a leak shows; file-backed pages are the model's
    weights and libraries)."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return float("nan"), {}
    total, per_process = 0, {}
    for proc in procs:
        try:
            rss = proc.memory_info().rss
            role = "server" if proc.pid == pid else proc.name()
        except psutil.NoSuchProcess:
            continue
        total += rss
        role = role if role not in per_process else f"{role}#{proc.pid}"
        per_process[role] = {"rss_mb": round(rss / 2**20, 1), "anon_mb": anonymous_mb(proc.pid)}
    return round(total / 2**20, 1), per_process


def anonymous_mb(pid: int) -> float | None:
    """``RssAnon`` of ``/proc/<pid>/status`` in MB (None where there is no such file)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None


def sample(url: str, pid: int, t: float) -> dict:
    info = requests.get(url + "/server_info", timeout=60).json()["internal_states"][0]
    pool = info[servers.KV_POOL_KEY]
    asks = info.get(STATS_KEY, {}).get("asks") or {}
    rss_mb, processes = process_tree_memory(pid)
    return {"t_s": round(t, 1), "rss_mb": rss_mb, "processes": processes,
            "kv_in_use": pool["total"] - pool["available"] - pool["evictable"], "kv_evictable": pool["evictable"],
            "kv_available": pool["available"], "queued": pool.get("queued_requests"),
            "running": pool.get("running_requests"), "signature_bytes": asks.get("signature_bytes"),
            "signatures_over_cap": asks.get("signatures_over_cap"),
            "heap_trims": (info.get("rksc_heap_trim") or {}).get("trims"),
            "heap_trim_released_mb": (info.get("rksc_heap_trim") or {}).get("released_mb")}


def run(settings: SoakSettings, server_args: list[str], log_dir: Path, progress: bool = True) -> dict:
    from tqdm import tqdm

    from benchmarks.serving.load import LoadSettings, prompts

    questions = prompts(LoadSettings(programs=32, shots=2))
    log = log_dir / "server.log"
    proc, url = servers.settle(servers.spawn("rksc_sgl.launch_server", server_args, log),
                               "rksc_sgl.launch_server", server_args, log)
    try:
        traffic = Traffic(url, settings, questions)
        outcomes: collections.Counter = collections.Counter()
        errors: list[str] = []
        latencies: dict[str, list[float]] = collections.defaultdict(list)
        samples: list[dict] = []
        lock = threading.Lock()
        start = time.monotonic()
        deadline = start + settings.duration_s

        def client(index: int) -> None:
            rng = random.Random(f"{settings.seed}/{index}")
            kinds, weights = zip(*MIX.items())
            while time.monotonic() < deadline:
                kind = rng.choices(kinds, weights)[0]
                t0 = time.monotonic()
                try:
                    outcome = getattr(traffic, kind)(rng)
                except requests.Timeout:
                    outcome = f"hung: no answer within {settings.action_timeout_s} s"
                except Exception as e:  # noqa: BLE001 - an unexpected failure is a finding, recorded
                    outcome = f"error: {type(e).__name__}: {e}"
                with lock:
                    latencies[kind].append(time.monotonic() - t0)
                    key = outcome.split(":")[0]
                    outcomes[f"{kind}:{key}"] += 1
                    if key not in ("ok", "refused") or (kind == "bad") != (key == "refused"):
                        errors.append(f"{kind}: {outcome}"[:300])

        threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(settings.clients)]
        for thread in threads:
            thread.start()
        with tqdm(total=int(settings.duration_s), desc="soak", unit="s", disable=not progress) as bar:
            while time.monotonic() < deadline:
                samples.append(sample(url, proc.pid, time.monotonic() - start))
                bar.update(min(int(time.monotonic() - start) - bar.n, bar.total - bar.n))
                bar.set_postfix(rss_mb=samples[-1]["rss_mb"], kv=samples[-1]["kv_in_use"], actions=sum(outcomes.values()))
                time.sleep(max(0.0, min(settings.sample_every_s, deadline - time.monotonic())))
        for thread in threads:  # each action has its own timeout; a thread still out after it hung
            thread.join(timeout=settings.action_timeout_s + 30)
        hung_threads = sum(t.is_alive() for t in threads)
        pool = servers.settled_pool(lambda: servers.kv_pool(url), 120)
        samples.append(sample(url, proc.pid, time.monotonic() - start))
        serves = requests.post(url + "/generate", timeout=120, json={
            "text": "Still there?", "sampling_params": {"max_new_tokens": 4, "temperature": 0}}).status_code == 200
        cap_bytes = asks_cap_bytes(server_args)
        return {"url": url, "outcomes": dict(sorted(outcomes.items())), "actions": sum(outcomes.values()),
                "errors": len(errors), "error_examples": errors[:5], "hung_threads": hung_threads,
                "latency_median_s": {k: round(statistics.median(v), 2) for k, v in sorted(latencies.items())},
                "pool_settled": servers.is_settled(pool), "serves_after": serves,
                "signature_cap_bytes": cap_bytes, **memory_verdict(samples, settings), "samples": samples}
    finally:
        servers.stop(proc)


def asks_cap_bytes(server_args: list[str]) -> int:
    from rksc_sgl.config import RkscConfig

    cap_mb = RkscConfig().asks_signature_cap_mb
    if "--asks-signature-cap-mb" in server_args:
        cap_mb = float(server_args[server_args.index("--asks-signature-cap-mb") + 1])
    return int(cap_mb * 2**20)


def memory_verdict(samples: list[dict], settings: SoakSettings) -> dict:
    """Resident memory after warm-up: its first value, its largest, the growth between and the
    least-squares slope (MB per hour); the largest signature bytes and KV held by running requests."""
    after = [s for s in samples if s["t_s"] >= settings.warmup_s] or samples[-1:]
    rss = [s["rss_mb"] for s in after]
    slope = 0.0
    if len(after) > 2:
        ts = [s["t_s"] for s in after]
        mt, mr = statistics.fmean(ts), statistics.fmean(rss)
        slope = sum((t - mt) * (r - mr) for t, r in zip(ts, rss)) / sum((t - mt) ** 2 for t in ts) * 3600
    return {"rss_after_warmup_mb": rss[0], "rss_max_after_warmup_mb": max(rss),
            "rss_growth_mb": round(max(rss) - rss[0], 1), "rss_slope_mb_per_h": round(slope, 1),
            "growth_by_process_mb": growth_by_process(after),
            "signature_bytes_max": max((s["signature_bytes"] or 0) for s in samples),
            "kv_in_use_max": max(s["kv_in_use"] for s in samples),
            "heap_trims": samples[-1].get("heap_trims"), "heap_trim_released_mb": samples[-1].get("heap_trim_released_mb")}


def growth_by_process(after: list[dict]) -> dict[str, dict[str, float]]:
    """Per process role, its resident and anonymous memory's growth from the first sample after
    warm-up to the largest after it (MB): which process grows, and whether it is heap."""
    out = {}
    first = after[0].get("processes") or {}
    for role in first:
        growth = {}
        for key in ("rss_mb", "anon_mb"):
            values = [s["processes"][role][key] for s in after
                      if role in (s.get("processes") or {}) and s["processes"][role][key] is not None]
            if values:
                growth[key] = round(max(values) - values[0], 1)
        out[role] = growth
    return out


def plot(record: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = record["samples"]
    t = [s["t_s"] / 60 for s in samples]
    fig, axes = plt.subplots(3, 1, figsize=(8, 7), sharex=True)
    axes[0].plot(t, [s["rss_mb"] for s in samples], label="all")
    for role in (samples[0].get("processes") or {}):
        axes[0].plot(t, [(s.get("processes") or {}).get(role, {}).get("rss_mb") for s in samples], lw=0.8, label=role)
    axes[0].axvline(record["settings"]["warmup_s"] / 60, color="grey", ls=":", label="end of warm-up")
    axes[0].set_ylabel("server RSS (MB)")
    axes[0].legend(loc="lower right")
    axes[1].plot(t, [s["kv_in_use"] for s in samples], label="held by running requests")
    axes[1].plot(t, [s["kv_evictable"] for s in samples], label="evictable (cached)")
    axes[1].set_ylabel("KV tokens")
    axes[1].legend(loc="upper right")
    axes[2].plot(t, [(s["signature_bytes"] or 0) / 2**20 for s in samples])
    axes[2].set_ylabel("ASKS signatures (MB)")
    axes[2].set_xlabel("minutes")
    fig.suptitle(f"soak: {record['actions']} actions, {record['settings']['clients']} clients "
                 f"({record['commit']}, {record['machine']})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__.splitlines()[0])
    d = SoakSettings()
    p.add_argument("--duration-s", type=float, default=d.duration_s, help="length of the run (default: %(default)s)")
    p.add_argument("--clients", type=int, default=d.clients, help="client threads (default: %(default)s)")
    p.add_argument("--sample-every-s", type=float, default=d.sample_every_s)
    p.add_argument("--warmup-s", type=float, default=d.warmup_s,
                   help="memory may grow until then: caches fill (default: %(default)s)")
    p.add_argument("--rss-growth-mb", type=float, default=d.rss_growth_mb,
                   help="largest resident-memory growth after warm-up that counts as flat (default: %(default)s)")
    p.add_argument("--action-timeout-s", type=float, default=d.action_timeout_s,
                   help="an action not answered by then hung (default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--server-args", default=DEFAULT_SERVER_ARGS,
                   help="flags of rksc_sgl.launch_server (default: %(default)s)")
    p.add_argument("--output", type=Path, default=RESULTS, help="results file, JSON lines (default: %(default)s)")
    args = p.parse_args(argv)
    try:
        args.settings = SoakSettings(args.duration_s, args.clients, args.sample_every_s, args.warmup_s,
                                     args.rss_growth_mb, args.action_timeout_s, args.max_new_tokens, args.seed)
    except ValueError as e:
        p.error(str(e))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    server_args = shlex.split(args.server_args)
    with tempfile.TemporaryDirectory(prefix="rksc-soak-") as logs:
        report = run(args.settings, server_args, Path(logs))
    ok = (report["errors"] == 0 and report["hung_threads"] == 0 and report["pool_settled"] and report["serves_after"]
          and report["signature_bytes_max"] <= report["signature_cap_bytes"]
          and report["rss_growth_mb"] <= args.settings.rss_growth_mb)
    record = {"benchmark": "soak", "model": MODEL_NAME, "commit": git_commit(), "machine": machine(),
              "date": time.strftime("%Y-%m-%d"),
              "command": "python -m benchmarks.soak " + shlex.join(argv if argv is not None else sys.argv[1:]),
              "settings": dataclasses.asdict(args.settings), "server_args": server_args, **report, "ok": ok}
    append_jsonl(args.output, [record])
    plot(record, args.output.with_suffix(".png"))
    print(json.dumps({k: v for k, v in record.items() if k != "samples"}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
