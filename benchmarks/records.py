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


def machine() -> str:
    return f"{platform.machine()}, {os.cpu_count()} cores, CPU"


def append_jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    if isinstance(rows, dict):  # iterating it would write its keys, one per line, and lose the record
        raise TypeError("append_jsonl: rows must be an iterable of dicts, got one dict (wrap it in a list)")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def latest_run(path: Path) -> list[dict]:
    """The rows of the newest ``run_id`` in a results file."""
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    if not rows:
        raise ValueError(f"{path} holds no results")
    last = max(r.get("run_id", "") for r in rows)
    return [r for r in rows if r.get("run_id", "") == last]
