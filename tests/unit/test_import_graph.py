"""The two sides meet only in the wire protocol: ``rksc_sgl`` (client side) never imports
``radix_ext`` (scheduler side); ``radix_ext`` imports from ``rksc_sgl`` only the protocol, the
config, the seam checker and the pure stop rules; the protocol imports neither torch nor SGLang."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCHEDULER_MAY_IMPORT = {"rksc_sgl", "rksc_sgl.protocol", "rksc_sgl.config", "rksc_sgl.seams", "rksc_sgl.stop_rules"}


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
    return {p.name: imported_modules(p) for p in sorted((ROOT / package).glob("*.py"))}


def test_the_client_side_never_imports_the_scheduler_side():
    offenders = {f: sorted(m for m in mods if m.split(".")[0] == "radix_ext")
                 for f, mods in package_imports("rksc_sgl").items()}
    assert not {f: m for f, m in offenders.items() if m}


def test_the_scheduler_side_imports_only_the_protocol_and_config_of_the_client_side():
    offenders = {}
    for f, mods in package_imports("radix_ext").items():
        ours = {m for m in mods if m.split(".")[0] == "rksc_sgl"}
        allowed = SCHEDULER_MAY_IMPORT - {"rksc_sgl"}
        # "from rksc_sgl import seams" records "rksc_sgl" and "rksc_sgl.seams": judge the latter.
        bad = sorted(m for m in ours if m != "rksc_sgl" and not any(m == ok or m.startswith(ok + ".") for ok in allowed))
        if bad:
            offenders[f] = bad
    assert not offenders


def test_the_graph_check_sees_imports_inside_functions(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from radix_ext.eviction.stats import KEY\n")
    assert "radix_ext.eviction.stats" in imported_modules(module)


def test_the_protocol_and_the_stop_rules_import_neither_torch_nor_sglang():
    code = ("import sys, rksc_sgl.protocol, rksc_sgl.stop_rules; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'sglang')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]"
