"""Import-time shims that let stock SGLang 0.5.23 run on a CPU-only PyTorch.

Why each shim exists (facts observed on a 2-core AVX-512 machine (no AMX) with the CPU build of torch 2.13.0):

* **torchvision ops.** SGLang imports torchvision (``srt/configs/deepseek_ocr.py``; transformers'
  image utilities too). The torchvision wheel that matches torch 2.13 is a CUDA build whose C
  extension cannot load beside a CPU torch; ``torchvision/_meta_registrations.py`` then calls
  ``register_fake("torchvision::nms")`` on an operator that does not exist and the import fails.
  Before torchvision is imported we try to load its C extension ourselves; only if that fails do we
  declare the schemas of ``torchvision::nms`` and ``torchvision::qnms`` (no kernels: SGLang's text
  path never calls them), and torchvision then imports unmodified.
* **sgl_kernel.** With ``SGLANG_USE_CPU_ENGINE=1`` SGLang imports CPU ops from ``sgl_kernel``, whose
  CPU build is not published on PyPI. On a CPU without AMX none of them is called (layers take
  ``forward_native``, attention ``torch_native``), so when no real ``sgl_kernel`` is installed we
  provide a stub package whose every callable raises ``RuntimeError`` naming itself if ever called.

SGLang starts its scheduler and detokenizer with ``spawn``, so the shims must be active in every
interpreter before SGLang is imported: ``install()`` puts a finder on ``sys.meta_path`` and the
one-line ``rksc_sgl_cpu_shims.pth`` (written by ``python -m rksc_sgl.cpu_shims``, which ``make
install`` runs) calls it at interpreter start-up. The finder costs one dict lookup per import and
never changes a package's files.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types

PTH_NAME = "rksc_sgl_cpu_shims.pth"
PTH_LINE = "import rksc_sgl.cpu_shims as _rksc_cpu_shims; _rksc_cpu_shims.install()\n"
_STUB_ROOT = "sgl_kernel"


class _Unavailable:
    """Stands for any ``sgl_kernel`` attribute: attribute access nests, calling it raises."""

    def __init__(self, qualname: str):
        self._qualname = qualname

    def __getattr__(self, name: str) -> "_Unavailable":
        if name.startswith("__"):
            raise AttributeError(name)
        return _Unavailable(f"{self._qualname}.{name}")

    def __call__(self, *args, **kwargs):
        raise RuntimeError(
            f"{self._qualname} was called, but only a stub of sgl_kernel is installed "
            "(its CPU build is not on PyPI). rksc_sgl.cpu_shims assumed this CPU path never "
            "calls it; please report the model/flags that reached it."
        )


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str) -> _Unavailable:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Unavailable(f"{self.__name__}.{name}")


class _StubLoader(importlib.abc.Loader):
    def create_module(self, spec):
        module = _StubModule(spec.name)
        module.__path__ = []  # a package, so that any submodule import resolves to a stub too
        return module

    def exec_module(self, module) -> None:
        module.__rksc_stub__ = True


class _CpuShimFinder(importlib.abc.MetaPathFinder):
    def __init__(self) -> None:
        self._torchvision_prepared = False

    def find_spec(self, fullname, path=None, target=None):
        if fullname == "torchvision" and not self._torchvision_prepared:
            self._torchvision_prepared = True
            _declare_torchvision_ops_if_missing()
            return None
        if fullname == _STUB_ROOT or fullname.startswith(_STUB_ROOT + "."):
            if os.environ.get("SGLANG_USE_CPU_ENGINE") != "1" or _real_sgl_kernel_exists():
                return None
            return importlib.machinery.ModuleSpec(fullname, _StubLoader(), is_package=True)
        return None


def _real_sgl_kernel_exists() -> bool:
    for finder in sys.meta_path:
        if isinstance(finder, _CpuShimFinder) or not hasattr(finder, "find_spec"):
            continue
        if finder.find_spec(_STUB_ROOT, None) is not None:
            return True
    return False


def _declare_torchvision_ops_if_missing() -> None:
    import glob

    import torch

    spec = None
    for finder in sys.meta_path:
        if not isinstance(finder, _CpuShimFinder) and hasattr(finder, "find_spec"):
            spec = finder.find_spec("torchvision", None)
            if spec is not None:
                break
    if spec is None or not spec.submodule_search_locations:
        return
    for folder in spec.submodule_search_locations:
        for lib in glob.glob(os.path.join(folder, "_C*.so")):
            try:
                torch.ops.load_library(lib)
                return  # torchvision's own ops loaded: nothing to shim
            except (ImportError, OSError):
                pass
    global _torchvision_lib  # keep the Library alive: dropping it would undefine the ops
    _torchvision_lib = torch.library.Library("torchvision", "DEF")
    _torchvision_lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _torchvision_lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")


def install() -> None:
    """Put the shim finder first on ``sys.meta_path`` (idempotent)."""
    if not any(isinstance(f, _CpuShimFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _CpuShimFinder())


def write_pth() -> str:
    """Write the start-up hook into this interpreter's site-packages; returns its path."""
    import sysconfig

    path = os.path.join(sysconfig.get_paths()["purelib"], PTH_NAME)
    with open(path, "w") as f:
        f.write(PTH_LINE)
    return path


if __name__ == "__main__":
    print(write_pth())
