"""The two sides meet only in the wire protocol: ``rksc_sgl`` (client side) never imports
``radix_ext`` (scheduler side); ``radix_ext`` imports from ``rksc_sgl`` only the protocol, the
early stop's options, the config, the seam checker and the pure stop rules; the protocol imports
neither torch nor SGLang. And every import between our modules points one way: the graph of
``radix_ext``, ``rksc_sgl``, ``programs`` and ``benchmarks`` has no circle, imports inside
functions included."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("radix_ext", "rksc_sgl", "programs", "benchmarks")
SCHEDULER_MAY_IMPORT = {"rksc_sgl", "rksc_sgl.protocol", "rksc_sgl.stop_options", "rksc_sgl.config",
                        "rksc_sgl.seams", "rksc_sgl.stop_rules"}


def imported_modules(path: Path) -> set[str]:
    """Every module named by an import statement anywhere in ``path`` (function bodies included)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def package_imports(package: str) -> dict[str, set[str]]:
    return {str(p.relative_to(ROOT)): imported_modules(p) for p in sorted((ROOT / package).rglob("*.py"))}


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def our_modules(root: Path = ROOT) -> dict[str, Path]:
    """Dotted name -> file, for every module of our four packages (``__init__`` as its package)."""
    return {module_name(p, root): p for package in PACKAGES for p in sorted((root / package).rglob("*.py"))}


def import_edges(path: Path, name: str, modules: dict[str, Path]) -> tuple[set[str], set[str]]:
    """The modules of ours that ``path`` (module ``name``) imports, and the names under our
    packages that it imports but no file of ours is (a stale or aliased path)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    edges, dangling = set(), set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
            candidates = [[t] for t in targets]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [base]
            # "from a import b": b is a module of its own if there is one, else a name in a
            candidates = [[f"{base}.{alias.name}", base] for alias in node.names]
        else:
            continue
        if targets[0].split(".")[0] not in PACKAGES:
            continue
        for target in targets:
            if target not in modules:
                dangling.add(target)
        for options in candidates:
            found = next((m for m in options if m in modules), None)
            if found is not None and found != name:
                edges.add(found)
    return edges, dangling


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    modules = our_modules(root)
    return {name: import_edges(path, name, modules)[0] for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of ``graph`` as ``[a, b, ..., a]``, or None (depth-first, three colours)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


class TestTheTwoSides:
    def test_the_client_side_never_imports_the_scheduler_side(self):
        offenders = {f: sorted(m for m in mods if m.split(".")[0] == "radix_ext")
                     for f, mods in package_imports("rksc_sgl").items()}
        assert not {f: m for f, m in offenders.items() if m}

    def test_the_scheduler_side_imports_only_the_protocol_and_config_of_the_client_side(self):
        offenders = {}
        for f, mods in package_imports("radix_ext").items():
            ours = {m for m in mods if m.split(".")[0] == "rksc_sgl"}
            allowed = SCHEDULER_MAY_IMPORT - {"rksc_sgl"}
            # "from rksc_sgl import seams" records "rksc_sgl" and "rksc_sgl.seams": judge the latter.
            bad = sorted(m for m in ours if m != "rksc_sgl"
                         and not any(m == ok or m.startswith(ok + ".") for ok in allowed))
            if bad:
                offenders[f] = bad
        assert not offenders

    def test_the_protocol_and_the_stop_rules_import_neither_torch_nor_sglang(self):
        code = ("import sys, rksc_sgl.protocol, rksc_sgl.stop_options, rksc_sgl.stop_rules; "
                "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'sglang')))")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
        assert out.stdout.strip() == "[]"


class TestNoCircles:
    def test_the_import_graph_of_our_modules_has_no_circle(self):
        cycle = find_cycle(import_graph())
        assert cycle is None, "import circle: " + " -> ".join(cycle)

    def test_every_import_of_ours_names_a_module_on_disk(self):
        """A moved module is imported by its new path (``benchmarks``' tool folders also answer to
        ``python -m benchmarks.<tool>``, a second name that code must not use)."""
        modules = our_modules()
        dangling = {str(path.relative_to(ROOT)): sorted(gone) for name, path in modules.items()
                    if (gone := import_edges(path, name, modules)[1])}
        tests = {str(p.relative_to(ROOT)): sorted(gone) for p in sorted((ROOT / "tests").rglob("*.py"))
                 if (gone := import_edges(p, module_name(p), modules)[1])}
        assert not dangling and not tests

    def test_the_graph_check_sees_imports_inside_functions(self, tmp_path):
        module = tmp_path / "m.py"
        module.write_text("def f():\n    from radix_ext.eviction.stats import KEY\n")
        assert "radix_ext.eviction.stats" in imported_modules(module)

    def test_a_circle_through_a_function_level_import_is_found_and_named(self, tmp_path):
        package = tmp_path / "radix_ext"
        package.mkdir()
        (package / "__init__.py").write_text("")
        (package / "a.py").write_text("from radix_ext import b\n")
        (package / "b.py").write_text("def f():\n    from radix_ext.a import X\n")
        assert find_cycle(import_graph(tmp_path)) == ["radix_ext.a", "radix_ext.b", "radix_ext.a"]

    @pytest.mark.parametrize("source, edge", [("from radix_ext.asks import gate\n", "radix_ext.asks.gate"),
                                              ("from radix_ext.asks.gate import Gate\n", "radix_ext.asks.gate"),
                                              ("from . import gate\n", "radix_ext.asks.gate"),
                                              ("from radix_ext.asks import SOMETHING\n", "radix_ext.asks")])
    def test_an_import_is_an_edge_to_the_module_it_loads(self, tmp_path, source, edge):
        asks = tmp_path / "radix_ext" / "asks"
        asks.mkdir(parents=True)
        for name in ("__init__.py", "gate.py"):
            (asks / name).write_text("")
        (tmp_path / "radix_ext" / "__init__.py").write_text("")
        (asks / "decision.py").write_text(source)
        assert import_graph(tmp_path)["radix_ext.asks.decision"] == {edge}
