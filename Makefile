# Thin wrapper over CMake: `make run` builds and runs the main job, `make test` builds and
# runs every test.
BUILD ?= build
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
GENERATOR := $(shell command -v ninja >/dev/null 2>&1 && echo "-G Ninja")

VENV ?= .venv
LIB := $(abspath $(BUILD))/libfdma.so

SANITIZE_BUILD ?= build-sanitize
TSAN_BUILD ?= build-tsan
# The suites that run the CPU backend from several threads, or with several workers.
THREADED_TESTS = *Concurrent*:Parallel.*:*DeterministicAcrossThreadCounts*:CAbi.LastErrorIsPerThread
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 60
FUZZ_RUNS ?= 30000

.PHONY: all build run test pytest sanitize fuzz fuzz-smoke bench clean

all: build

$(BUILD)/.configured: CMakeLists.txt tests/CMakeLists.txt
	cmake -S . -B $(BUILD) $(GENERATOR) -DCMAKE_BUILD_TYPE=Release
	@touch $@

build: $(BUILD)/.configured
	cmake --build $(BUILD) -j $(JOBS)

run: build
	$(BUILD)/fdma run

test: build $(VENV)/.ready
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)
	FDMA_LIBRARY=$(LIB) $(VENV)/bin/python -m pytest tests/python -q
	$(MAKE) sanitize
	$(MAKE) fuzz-smoke

# The C++ suites again on a CPU-only build under AddressSanitizer and UndefinedBehaviorSanitizer
# (any out-of-bounds access, use after free, leak, overflow or misaligned access fails the run),
# and the threaded ones under ThreadSanitizer (a data race fails it).
$(SANITIZE_BUILD)/.configured: CMakeLists.txt tests/CMakeLists.txt
	cmake -S . -B $(SANITIZE_BUILD) $(GENERATOR) -DCMAKE_BUILD_TYPE=Release -DFDMA_WITH_CUDA=OFF \
	  -DFDMA_SANITIZE=address,undefined
	@touch $@

$(TSAN_BUILD)/.configured: CMakeLists.txt tests/CMakeLists.txt
	cmake -S . -B $(TSAN_BUILD) $(GENERATOR) -DCMAKE_BUILD_TYPE=Release -DFDMA_WITH_CUDA=OFF -DFDMA_SANITIZE=thread
	@touch $@

sanitize: $(SANITIZE_BUILD)/.configured $(TSAN_BUILD)/.configured
	cmake --build $(SANITIZE_BUILD) -j $(JOBS)
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  ctest --test-dir $(SANITIZE_BUILD) --output-on-failure -j $(JOBS)
	cmake --build $(TSAN_BUILD) -j $(JOBS) --target fdma_tests
	TSAN_OPTIONS=halt_on_error=1 $(TSAN_BUILD)/tests/fdma_tests --gtest_filter='$(THREADED_TESTS)'

# The Python tests only (CPU backend; add PYTEST_ARGS="--device cuda" on a GPU machine).
pytest: build $(VENV)/.ready
	FDMA_LIBRARY=$(LIB) $(VENV)/bin/python -m pytest tests/python -q $(PYTEST_ARGS)

# A virtual environment with torch and pytest for the Python tests (about 2-3 minutes and
# 5.6 GB the first time: torch from PyPI brings its CUDA libraries). No pip cache: it would
# keep another 3 GB of wheels on a machine whose disk may be nearly full.
$(VENV)/.ready: python/requirements-test.txt
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check --no-cache-dir -r python/requirements-test.txt
	@touch $@

# The C ABI fuzz target (tests/fuzz/fuzz_capi.cpp): clang, libFuzzer, ASan and UBSan over a
# CPU-only library. `make fuzz` runs for FUZZ_SECONDS from the seed corpus in tests/fuzz/corpus,
# keeping what it finds in $(FUZZ_BUILD)/corpus; `make fuzz-smoke` (part of make test) runs
# FUZZ_RUNS inputs. A crash leaves its input as crash-* in the current directory.
$(FUZZ_BUILD)/.configured: CMakeLists.txt
	CC=clang CXX=clang++ cmake -S . -B $(FUZZ_BUILD) $(GENERATOR) -DCMAKE_BUILD_TYPE=Release -DFDMA_WITH_CUDA=OFF \
	  -DFDMA_BUILD_TESTS=OFF -DFDMA_FUZZ=ON -DFDMA_SANITIZE=address,undefined,fuzzer-no-link
	@touch $@

FUZZ_FLAGS = -max_len=2048 -timeout=20 -rss_limit_mb=4096 -print_final_stats=1

fuzz: $(FUZZ_BUILD)/.configured
	cmake --build $(FUZZ_BUILD) -j $(JOBS) --target fuzz_capi
	mkdir -p $(FUZZ_BUILD)/corpus
	$(FUZZ_BUILD)/fuzz_capi $(FUZZ_FLAGS) -max_total_time=$(FUZZ_SECONDS) $(FUZZ_BUILD)/corpus tests/fuzz/corpus

fuzz-smoke: $(FUZZ_BUILD)/.configured
	cmake --build $(FUZZ_BUILD) -j $(JOBS) --target fuzz_capi
	rm -rf $(FUZZ_BUILD)/smoke && mkdir -p $(FUZZ_BUILD)/smoke  # new inputs go there, not into the repository
	$(FUZZ_BUILD)/fuzz_capi $(FUZZ_FLAGS) -runs=$(FUZZ_RUNS) $(FUZZ_BUILD)/smoke tests/fuzz/corpus

bench: build
	$(BUILD)/fdma bench

clean:
	rm -rf $(BUILD) $(SANITIZE_BUILD) $(TSAN_BUILD) $(FUZZ_BUILD)
