"""The plain ``sglang.launch_server`` command exactly as ``docs/serving.md`` writes it, so that the
tests run what an operator would copy (the block after the ``plain-sglang-server`` marker); the
admin endpoints it lists (after the ``admin-endpoints`` marker), and SGLang's own list of them."""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import shlex
from pathlib import Path

SERVING_DOC = Path(__file__).resolve().parents[2] / "docs" / "serving.md"
MARKER = "<!-- plain-sglang-server:"
ADMIN_MARKER = "<!-- admin-endpoints:"
ROUTE_DECORATORS = {"api_route": None, "get": "GET", "post": "POST", "put": "PUT", "delete": "DELETE"}


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


def documented_admin_paths(doc: Path = SERVING_DOC) -> set[str]:
    """Every ``/path`` in backticks in the paragraph after the ``admin-endpoints`` marker."""
    block = re.search(re.escape(ADMIN_MARKER) + r"[^\n]*-->\n(.*?)\n\n", doc.read_text(), re.S)
    if block is None:
        raise AssertionError(f"{doc} has no paragraph after {ADMIN_MARKER!r}")
    return set(re.findall(r"`(/[^`\s]*)`", block.group(1)))


def sglang_admin_routes() -> dict[str, list[str]]:
    """SGLang's HTTP routes marked admin (``@auth_level(AuthLevel.ADMIN_*)``), path -> methods,
    read from the installed ``http_server.py`` without importing it."""
    source = Path(importlib.util.find_spec("sglang.srt.entrypoints.http_server").origin).read_text()
    routes: dict[str, list[str]] = {}
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        calls = [d for d in node.decorator_list if isinstance(d, ast.Call)]
        if not any(isinstance(c.func, ast.Name) and c.func.id == "auth_level" and c.args
                   and ast.unparse(c.args[0]).startswith("AuthLevel.ADMIN") for c in calls):
            continue
        for c in calls:
            if isinstance(c.func, ast.Attribute) and c.func.attr in ROUTE_DECORATORS and c.args:
                path = ast.literal_eval(c.args[0])
                methods = next((ast.literal_eval(k.value) for k in c.keywords if k.arg == "methods"),
                               [ROUTE_DECORATORS[c.func.attr] or "GET"])
                routes.setdefault(path, []).extend(methods)
    return routes
