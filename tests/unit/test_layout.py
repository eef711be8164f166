"""The tree reads as the architecture: no product file is over 400 lines, ``docs/architecture.md``
names every module (and none that is gone), and every documented ``python -m`` command of the
harness runs a module that exists."""

from __future__ import annotations

import ast
import importlib.util
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("rksc_sgl", "radix_ext", "programs")
MODULE_PACKAGES = ("rksc_sgl", "radix_ext", "programs", "benchmarks")
MAX_LINES = 400
ARCHITECTURE = ROOT / "docs" / "architecture.md"
COMMAND_SOURCES = ("README.md", "Makefile", "docs")


def python_files(packages) -> list[Path]:
    return sorted(p for package in packages for p in (ROOT / package).rglob("*.py") if "results" not in p.parts)


def relative(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def only_a_docstring(path: Path) -> bool:
    body = ast.parse(path.read_text()).body
    return all(isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) for node in body)


def documented_modules(text: str) -> set[str]:
    """``folder/name.py`` for each bullet ``- `name.py`: ...`` under a heading that names a folder
    (``### `radix_ext/asks/` (...)``)."""
    folder, named = None, set()
    for line in text.splitlines():
        heading = re.match(r"^#+ `([\w/]+/)`", line)
        if heading:
            folder = heading.group(1)
        elif line.startswith("#"):
            folder = None
        bullet = re.match(r"^- `([\w.]+\.py)`", line)
        if bullet and folder:
            named.add(folder + bullet.group(1))
    return named


class TestFileSizes:
    def test_no_product_file_is_over_the_limit(self):
        over = {relative(p): n for p in python_files(PRODUCT) if (n := len(p.read_text().splitlines())) > MAX_LINES}
        assert not over, over


class TestArchitectureDoc:
    def test_every_module_is_named_under_its_folder(self):
        required = {relative(p) for p in python_files(MODULE_PACKAGES)
                    if not (p.name == "__init__.py" and only_a_docstring(p))}
        assert required - documented_modules(ARCHITECTURE.read_text()) == set()

    def test_every_named_module_and_path_exists(self):
        text = ARCHITECTURE.read_text()
        paths = set(re.findall(r"`((?:rksc_sgl|radix_ext|programs|benchmarks|tests|docs)/[\w/.-]*)`", text))
        missing = sorted(p for p in documented_modules(text) | paths if not (ROOT / p).exists())
        assert not missing

    def test_the_heading_parser_reads_folders_and_bullets(self):
        text = "### `radix_ext/`\n- `plugin.py`: x\n#### `radix_ext/asks/` (ASKS)\n- `gate.py`: y\n## Other\n- `z.py`: no"
        assert documented_modules(text) == {"radix_ext/plugin.py", "radix_ext/asks/gate.py"}


def documented_commands() -> dict[str, set[str]]:
    """Module -> where ``python -m <module>`` of ours is written: README, Makefile, docs, code,
    and the ``command`` recorded by every results file of the harness."""
    found: dict[str, set[str]] = {}
    pattern = re.compile(r"python -m ((?:benchmarks|rksc_sgl|programs|radix_ext)(?:\.\w+)*)(?![\w.<])")
    texts = [ROOT / "README.md", ROOT / "Makefile", *sorted((ROOT / "docs").glob("*.md")),
             *python_files(MODULE_PACKAGES)]
    for path in texts:
        for module in pattern.findall(path.read_text()):
            found.setdefault(module, set()).add(relative(path))
    for path in sorted((ROOT / "benchmarks" / "results").rglob("*.json*")):
        lines = path.read_text().splitlines() if path.suffix == ".jsonl" else [path.read_text()]
        for line in lines:
            if not line.strip():
                continue
            command = json.loads(line).get("command") if line.lstrip().startswith("{") else None
            for module in pattern.findall(command or ""):
                found.setdefault(module, set()).add(relative(path))
    return found


# Recorded by runs of an older layout: the bench and best-of-N's command lived in programs/ until
# 487a7a1 moved the harness to benchmarks/ (their results rows stay as they were recorded).
RETIRED = {"programs.bench", "programs.bon"}


class TestCommands:
    def test_the_harness_commands_of_the_docs_and_the_results_are_found(self):
        commands = documented_commands()
        assert {"benchmarks.bench", "benchmarks.report", "benchmarks.plot", "benchmarks.load"} <= set(commands)

    @pytest.mark.parametrize("module", sorted(set(documented_commands()) - RETIRED))
    def test_every_documented_command_runs_a_module_with_a_main(self, module):
        spec = importlib.util.find_spec(module)
        assert spec is not None, f"python -m {module}: no such module"
        if spec.submodule_search_locations is not None:  # a package: runs its __main__
            spec = importlib.util.find_spec(module + ".__main__")
            assert spec is not None, f"python -m {module}: the package has no __main__"
            return
        assert '__name__ == "__main__"' in Path(spec.origin).read_text(), f"python -m {module} runs nothing"
