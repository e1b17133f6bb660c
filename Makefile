# Thin wrapper over CMake: `make run` builds and runs the main job, `make test` builds and
# runs every test.
BUILD ?= build
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
GENERATOR := $(shell command -v ninja >/dev/null 2>&1 && echo "-G Ninja")

.PHONY: all build run test bench clean

all: build

$(BUILD)/.configured: CMakeLists.txt tests/CMakeLists.txt
	cmake -S . -B $(BUILD) $(GENERATOR) -DCMAKE_BUILD_TYPE=Release
	@touch $@

build: $(BUILD)/.configured
	cmake --build $(BUILD) -j $(JOBS)

run: build
	$(BUILD)/fdma run

test: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

bench: build
	$(BUILD)/fdma bench

clean:
	rm -rf $(BUILD)
