# Every target sets itself up on a fresh machine: it creates .venv and installs what it needs.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.kvsim-installed
TEST_STAMP := $(VENV)/.kvsim-test-installed
BENCH_STAMP := $(VENV)/.kvsim-bench-installed
# The compiled core (sim/native.py): mypyc builds the cache's, the SGLang engine's, the
# recorder's, the replay's and the fleet front's modules beside their sources, at install time
# (setup.py: `pip install -e .` above compiles them).
CORE_STAMP := sim/core-manifest.json

.PHONY: demo test lint bench venv core clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

# Rebuilt when a source of a package with compiled modules changes, or a module they import
# from (setup.py dependencies: the config, policies, cost model, traces), as the manifest's
# staleness check does (a stale extension is never imported: sim/native.py falls back to the
# source). Without a C compiler it says so once and kvsim runs on Python. The install builds
# it first (order-only: a fresh install's build is not redone).
$(CORE_STAMP): setup.py sim/native.py sim/replay.py sim/config.py $(wildcard sim/kvcache/*.py sim/engines/*.py sim/context/*.py sim/fleet/*.py policies/*.py costmodel/*.py traces/*.py) | $(STAMP)
	$(BIN)/pip install -q mypy==2.4.1
	$(BIN)/python setup.py -q build_ext --inplace

# Tests also need CPU torch (calibration, the SGLang reference), the real SGLang radix caches
# installed without their ~100 dependencies (see benchmarks/sglang_ref.py; msgspec is the one
# the default UnifiedRadixCache really uses, benchmarks/sglang_unified_ref.py), the real vLLM
# KVCacheManager and V1 scheduler the same way plus cbor2, which its hashing module imports, in
# both releases kvsim models: 0.33.0 in the venv, 0.34.0 in its own folder off sys.path (see
# benchmarks/vllm_ref.py), duckdb (the TraceLab DuckDB loader), ray (the Ray sweep executor)
# and aiconfigurator-core (the measured kernel tables of `kvsim calibrate --from-kernels`),
# and the real routers the differential tests run beside kvsim's (tests/realrouters.py): the
# SGLang Model Gateway binary (smg, a Rust wheel; its launcher needs setproctitle) and
# Dynamo's selector (ai-dynamo + ai-dynamo-runtime without their serving stack, plus the few
# modules `dynamo.llm` imports): nothing is skipped in CI. A change to this list (the Makefile)
# reinstalls it in an existing .venv.
$(TEST_STAMP): $(STAMP) Makefile
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q --no-deps sglang==0.5.23
	$(BIN)/pip install -q msgspec==0.23.0
	$(BIN)/pip install -q --no-deps vllm==0.33.0 cbor2==6.3.0
	test -d $(VENV)/vllm-0.34.0/vllm-0.34.0.dist-info || \
		$(BIN)/pip install -q --no-deps --target $(VENV)/vllm-0.34.0 vllm==0.34.0
	$(BIN)/pip install -q -e '.[duckdb,ray,kernels]'
	$(BIN)/pip install -q --no-deps smg==1.13.0 setproctitle==1.3.8
	$(BIN)/pip install -q --no-deps ai-dynamo==1.6.1 ai-dynamo-runtime==1.6.1 \
		pydantic==2.13.5 pydantic-core==2.46.5 annotated-types==0.8.0 \
		typing-inspection==0.4.5 uvloop==0.23.0 pyzmq==27.3.0
	touch $@

venv: $(STAMP)

core: $(CORE_STAMP)

# The embedded default: no downloads, no ../shared/data. Compares the three presets on the
# synthetic Claude Code trace (fitted to the real one) and writes a table and PNG plots.
DEMO_TRACE := synthetic:claude-code?sessions=40

demo: $(STAMP) $(CORE_STAMP)
	$(BIN)/kvsim microbench figure1
	$(BIN)/kvsim run --trace '$(DEMO_TRACE)' --max-context 128k --gaps tool --model qwen3-8b \
		--gpu-cache 192k --sessions 4 --preset sglang,vllm,penelope --out out/demo
	$(BIN)/kvsim plot out/demo

# The suite runs what users run, the compiled core; then a Python-path job beside it: the
# goldens and the engines' tests and differentials against the real SGLang and vLLM, plus the
# tests marked pure_path (spies on compiled classes; tests/conftest.py). The core's own
# differential (tests/test_native_core.py) runs both paths in the first job.
PURE_TESTS := tests/test_refactor_goldens.py tests/test_eviction_golden.py \
	tests/test_zoo_golden.py tests/test_engine.py tests/test_engine_sglang.py \
	tests/test_sglang_diff.py tests/test_engine_vllm.py tests/test_vllm_diff.py

test: $(TEST_STAMP) $(CORE_STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -n 2 --dist loadfile
	KVSIM_PURE=1 $(BIN)/python -m pytest -n 2 --dist loadfile $(PURE_TESTS)
	KVSIM_PURE=1 $(BIN)/python -m pytest -n 2 --dist loadfile -m pure_path

lint: $(STAMP)
	$(BIN)/ruff check .

# Benchmarks also run Dynamo's offline replay (benchmarks/bench_dynamo.py): the test stamp's
# ai-dynamo wheels plus the two modules dynamo.replay imports beyond what the selector needs;
# and the C++ capacity peer, kvcache-simulator (benchmarks/bench_capacity_peer.py; no deps).
$(BENCH_STAMP): $(TEST_STAMP) Makefile
	$(BIN)/pip install -q --no-deps tqdm==4.70.1 zstandard==0.25.0 kvcache-simulator==0.1.3
	touch $@

bench: $(BENCH_STAMP) $(CORE_STAMP)
	$(BIN)/python -m benchmarks.run_all

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis build *.egg-info $(CORE_STAMP)
	find sim -name '*.so' -delete
