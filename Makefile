# Top-level entry points. Each does the whole build (CMake) on a fresh machine.
#   make test   build everything, run the C tests (CPU + multi-GPU) and the Python tests
#   make perf   build and run the benchmark dps-perf (ARGS="..." passes options)
BUILD ?= build
PYTHON ?= python3
CMAKE_ARGS ?=
JOBS ?= $(shell nproc 2>/dev/null || echo 2)

.PHONY: all build test test-c test-python perf clean

all: build

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DDPS_BUILD_PYTHON=ON -DDPS_NCCL_FROM_PIP=ON -DPython3_EXECUTABLE=$$(command -v $(PYTHON)) $(CMAKE_ARGS)

build: $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

test-c: build
	ctest --test-dir $(BUILD) --output-on-failure

test-python: build
	PYTHONPATH=$(CURDIR)/$(BUILD)/python:$$PYTHONPATH $(PYTHON) -m pytest -v -rs python/tests

test: test-c test-python

perf: build
	$(BUILD)/tools/dps-perf $(ARGS)

clean:
	rm -rf $(BUILD)
