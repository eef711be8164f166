"""What ``rksc_sgl`` exports is what each name says it is, and importing the package stays cheap."""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys

import pytest

import rksc_sgl

CLASSES = ("RkscConfig", "RkscEndpoint", "RkscEngineEndpoint", "Candidate", "CgeeThresholds", "StopRule")
FUNCTIONS = ("launch_engine", "default_model_path", "branch_options", "report_score", "verify", "token_logprobs", "paraphrase_fork", "share_chunks",
             "adaptive_fork")


def test_the_exports_are_exactly_these_classes_and_functions():
    assert sorted(rksc_sgl.__all__) == sorted(CLASSES + FUNCTIONS)


@pytest.mark.parametrize("name", CLASSES)
def test_a_class_export_is_a_class(name):
    assert inspect.isclass(getattr(rksc_sgl, name))


@pytest.mark.parametrize("name", FUNCTIONS)
def test_a_function_export_is_a_function(name):
    assert inspect.isfunction(getattr(rksc_sgl, name))


@pytest.mark.parametrize("name", CLASSES + FUNCTIONS)
def test_an_export_is_not_shadowed_once_its_module_is_imported(name):
    """A submodule named like an export replaces it in the package's namespace on import."""
    export = getattr(rksc_sgl, name)
    importlib.import_module(export.__module__)
    assert getattr(rksc_sgl, name) is export
    assert not inspect.ismodule(export)


def test_from_import_gives_the_verify_function():
    code = "from rksc_sgl import verify; from rksc_sgl import verify as again; print(type(verify).__name__, type(again).__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["function", "function"]


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no_such_name"):
        rksc_sgl.no_such_name  # noqa: B018


def test_importing_the_package_imports_neither_torch_nor_sglang():
    code = "import sys, rksc_sgl; print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'sglang')))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "[]"
