"""What the README's examples import resolves from ``rksc_sgl``, and importing it stays cheap."""

from __future__ import annotations

import subprocess
import sys

import pytest

import rksc_sgl

README_NAMES = ("branch_options", "Candidate", "RkscEndpoint", "EngineBackend", "verify", "report_score",
                "launch_engine", "RkscConfig")


@pytest.mark.parametrize("name", README_NAMES)
def test_every_readme_name_resolves(name):
    assert name in rksc_sgl.__all__
    assert getattr(rksc_sgl, name) is not None


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no_such_name"):
        rksc_sgl.no_such_name  # noqa: B018


def test_importing_the_package_imports_neither_torch_nor_sglang():
    code = "import sys, rksc_sgl; print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'sglang')))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "[]"
