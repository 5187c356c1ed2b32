# kvroute: `make demo` and `make test` do everything on a fresh Debian 12 machine.
BUILD      ?= build
ASAN_BUILD ?= build-asan
JOBS       ?= $(shell nproc)
GENERATOR  := $(shell command -v ninja >/dev/null 2>&1 && echo "-G Ninja")

.PHONY: all deps build build-kvroute demo test test-asan test-tsan tidy tidy-core bench fuzz image image-check clean

all: build

deps:
	@bash scripts/install-deps.sh

$(BUILD)/CMakeCache.txt: | deps
	cmake -S . -B $(BUILD) $(GENERATOR) -DCMAKE_BUILD_TYPE=Release

build: deps $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

# The demo needs only the binary: skip tests and micro-benchmarks to keep `make demo` short.
build-kvroute: deps $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS) --target kvroute

demo: build-kvroute
	./$(BUILD)/kvroute demo

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 300

ASAN_TESTS := api_tests engine_tests kvevents_core_tests sched_tests health_tests routing_tests flow_tests extproc_tests k8s_tests fault_tests workload_tests report_tests metrics_tests config_tests doctor_core_tests

# Unit tests (pure core, no sockets) under AddressSanitizer + UBSan.
test-asan: deps
	cmake -S . -B $(ASAN_BUILD) $(GENERATOR) -DCMAKE_BUILD_TYPE=Debug -DKVROUTE_SANITIZE=ON -DKVROUTE_BENCHMARKS=OFF
	cmake --build $(ASAN_BUILD) -j $(JOBS) --target $(ASAN_TESTS)
	cd $(ASAN_BUILD) && ctest --output-on-failure -j $(JOBS) -L 'core|metrics|config'

TSAN_BUILD ?= build-tsan
# The routing core's concurrency tests (picks, scrapes, /metrics and reloads on several
# threads at once) and Kubernetes discovery (its io thread, the pool's lock, deliveries
# and Stop against the API stand-in) under ThreadSanitizer.
test-tsan: deps
	cmake -S . -B $(TSAN_BUILD) $(GENERATOR) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVROUTE_BENCHMARKS=OFF \
	  -DCMAKE_CXX_FLAGS=-fsanitize=thread -DCMAKE_EXE_LINKER_FLAGS=-fsanitize=thread
	cmake --build $(TSAN_BUILD) -j $(JOBS) --target routing_tests pool_tests
	TSAN_OPTIONS=halt_on_error=1 ./$(TSAN_BUILD)/tests/routing_tests
	TSAN_OPTIONS=halt_on_error=1 ./$(TSAN_BUILD)/tests/pool_tests --gtest_filter='Kubernetes*'

# The curated clang-tidy run (.clang-tidy: bugprone-*, performance-*, no function over 150
# lines) with the Release build's compile commands: `make tidy` over all of src/ (not in
# CI yet; about 15 CPU-minutes from an empty cache, seconds when only a few units changed:
# clean verdicts are cached by each unit's preprocessed text, scripts/clang_tidy_run.py),
# `make tidy-core` over the pure layers (src/core, src/config, src/simkit). Fails on any
# finding.
tidy: deps $(BUILD)/CMakeCache.txt
	bash scripts/clang-tidy.sh $(BUILD)

tidy-core: deps $(BUILD)/CMakeCache.txt
	bash scripts/clang-tidy.sh $(BUILD) src/core src/config src/simkit

FUZZ_BUILD   ?= build-fuzz
FUZZ_SECONDS ?= 60
FUZZ_JOBS    ?= 1
# libFuzzer targets (fuzz/), one per parser of outside input, built with clang 14 and
# ASan + UBSan (asserts on); each runs FUZZ_SECONDS. Prints executions, exec/s, coverage
# and findings per target; fails on any finding. See docs/RELIABILITY.md, "Fuzzing".
fuzz: deps
	cmake -S . -B $(FUZZ_BUILD) $(GENERATOR) -DCMAKE_CXX_COMPILER=clang++-14 -DKVROUTE_FUZZ=ON \
	  -DKVROUTE_BENCHMARKS=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -gline-tables-only"
	cmake --build $(FUZZ_BUILD) -j $(JOBS) --target fuzzers
	FUZZ_SECONDS=$(FUZZ_SECONDS) FUZZ_JOBS=$(FUZZ_JOBS) bash fuzz/run.sh $(FUZZ_BUILD)

IMAGE_VERSION := $(shell awk '/^project.kvroute VERSION / { print $$3 }' CMakeLists.txt)
# The container image kvroute:$(IMAGE_VERSION), built without a container daemon from Debian's
# archive (scripts/build-image.sh, deploy/container/README.md): $(BUILD)/image/kvroute-$(IMAGE_VERSION).oci.tar
# and .docker.tar, their file listing checked against deploy/container/rootfs-files.txt, and
# the image run under chroot. Root or sudo, and deb.debian.org; not part of `make test`.
image: build-kvroute
	bash scripts/build-image.sh $(BUILD)/kvroute

# The chroot check alone, on the archive `make image` wrote.
image-check:
	bash deploy/container/check-image.sh $(BUILD)/image/kvroute-$(IMAGE_VERSION).oci.tar

bench: build
	@for b in $(BUILD)/bench/*_bench; do echo "== $$b"; $$b; done

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD) $(FUZZ_BUILD)
