"""The plain ``sglang.launch_server`` command exactly as ``docs/serving.md`` writes it, so that the
tests run what an operator would copy (the block after the ``plain-sglang-server`` marker)."""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

SERVING_DOC = Path(__file__).resolve().parents[2] / "docs" / "serving.md"
MARKER = "<!-- plain-sglang-server:"


def documented_command(doc: Path = SERVING_DOC) -> tuple[dict[str, str], str, list[str]]:
    """(environment, module, arguments) of the marked block, read as a shell would: backslash
    continuations joined, leading ``NAME=value`` words as the environment, ``~`` expanded."""
    block = re.search(re.escape(MARKER) + r"[^\n]*-->\n```bash\n(.*?)\n```", doc.read_text(), re.S)
    if block is None:
        raise AssertionError(f"{doc} has no ```bash block after {MARKER!r}")
    words = shlex.split(block.group(1).replace("\\\n", " "))
    env = {}
    while re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0], re.S):
        name, value = words.pop(0).split("=", 1)
        env[name] = value
    if words[:2] != ["python", "-m"]:
        raise AssertionError(f"the block in {doc} is not a `python -m` command: {words[:3]}")
    return env, words[2], [os.path.expanduser(w) for w in words[3:]]
