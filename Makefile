# Thin wrapper over CMake: `make run` builds and runs the main job, `make test` builds and
# runs every test.
BUILD ?= build
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
GENERATOR := $(shell command -v ninja >/dev/null 2>&1 && echo "-G Ninja")

VENV ?= .venv
LIB := $(abspath $(BUILD))/libfdma.so

SANITIZE_BUILD ?= build-sanitize

.PHONY: all build run test pytest sanitize bench clean

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

# The C++ suites again on a CPU-only build under AddressSanitizer and UndefinedBehaviorSanitizer:
# any out-of-bounds access, use after free, leak, overflow or misaligned access fails the run.
$(SANITIZE_BUILD)/.configured: CMakeLists.txt tests/CMakeLists.txt
	cmake -S . -B $(SANITIZE_BUILD) $(GENERATOR) -DCMAKE_BUILD_TYPE=Release -DFDMA_WITH_CUDA=OFF \
	  -DFDMA_SANITIZE=address,undefined
	@touch $@

sanitize: $(SANITIZE_BUILD)/.configured
	cmake --build $(SANITIZE_BUILD) -j $(JOBS)
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  ctest --test-dir $(SANITIZE_BUILD) --output-on-failure -j $(JOBS)

# The Python tests only (CPU backend; add PYTEST_ARGS="--device cuda" on a GPU machine).
pytest: build $(VENV)/.ready
	FDMA_LIBRARY=$(LIB) $(VENV)/bin/python -m pytest tests/python -q $(PYTEST_ARGS)

# A virtual environment with torch and pytest for the Python tests (about 2-3 minutes and
# 5 GB the first time: torch from PyPI brings its CUDA libraries).
$(VENV)/.ready: python/requirements-test.txt
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -r python/requirements-test.txt
	@touch $@

bench: build
	$(BUILD)/fdma bench

clean:
	rm -rf $(BUILD) $(SANITIZE_BUILD)
