"""What every results file of ``programs/`` records about its run, and how rows are read back.

``git_commit()`` (``-dirty`` when tracked files other than results differ from HEAD: the figures then did not come
from committed code), ``machine()``, ``append_jsonl()`` and ``latest_run()``, shared by the
benchmark, the speed and comparison tools, the report and the plots.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Any, Iterable

from rksc_sgl.model_cache import MODEL_NAME  # noqa: F401 (recorded as the default model)


RESULTS_PATHSPEC = "benchmarks/results"


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
        # Results files appended by an earlier run are not code: they leave the commit clean.
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                                f":!{RESULTS_PATHSPEC}"], capture_output=True, text=True)
        return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


# cpuinfo flags that pick a kernel path (radix_ext.cpu): one model name covers CPUs with and without AMX
KERNEL_FLAGS = (("avx512_vnni", "AVX-512 VNNI"), ("amx_int8", "AMX"))


def machine(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """E.g. ``x86_64, Intel(R) Xeon(R) Processor (AVX-512 VNNI, AMX), 2 cores, CPU``: the
    processor's model where ``cpuinfo`` names it, and which of ``KERNEL_FLAGS`` it has, since
    figures from two models of one architecture do not compare, nor two CPUs of one model name
    whose kernels differ."""
    model, flags = "", set()
    try:
        lines = cpuinfo.read_text().splitlines()
        model = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "")
        flags = set(next((line.split(":", 1)[1].split() for line in lines if line.startswith("flags")), []))
    except OSError:
        pass
    named = [name for flag, name in KERNEL_FLAGS if flag in flags]
    if model and named:
        model += f" ({', '.join(named)})"
    return ", ".join(x for x in (platform.machine(), model, f"{os.cpu_count()} cores", "CPU") if x)


def append_jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    if isinstance(rows, dict):  # iterating it would write its keys, one per line, and lose the record
        raise TypeError("append_jsonl: rows must be an iterable of dicts, got one dict (wrap it in a list)")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def latest_run(path: Path) -> list[dict]:
    """The newest figures of a results file: for each dataset, the rows of the newest ``run_id``
    that covers it (rows without a dataset count as one). A file written by whole runs gives the
    newest run; a long table run one dataset per process gives each dataset's own run. Datasets
    keep the order in which the file first names them. Runs on problems held apart for choosing
    thresholds (``calibration_offset`` > 0) are never a table's figures."""
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    rows = [r for r in rows if not r.get("calibration_offset")]
    if not rows:
        raise ValueError(f"{path} holds no results")
    newest: dict[Any, str] = {}
    for r in rows:
        key, run = r.get("dataset"), r.get("run_id", "")
        newest[key] = max(newest.get(key, run), run)
    order = list(dict.fromkeys(r.get("dataset") for r in rows))
    return [r for key in order for r in rows if r.get("dataset") == key and r.get("run_id", "") == newest[key]]


def runs_of(rows: list[dict]) -> list[list[dict]]:
    """``rows`` split by ``run_id``, in order of appearance (one list for a single run)."""
    by_run: dict[str, list[dict]] = {}
    for r in rows:
        by_run.setdefault(r.get("run_id", ""), []).append(r)
    return list(by_run.values())
