# Thin wrapper over CMake: `make demo` and `make test` do all the set-up.
BUILD      ?= build
BUILD_ASAN ?= build-asan
BUILD_FUZZ ?= build-fuzz
BUILD_RELEASE ?= build-release
# Seconds each fuzz harness runs: in `make test`, and in `make fuzz`.
FUZZ_TEST_SECONDS ?= 4
FUZZ_SECONDS ?= 60
JOBS       ?= $(shell nproc)
# Tests run at once: two more than the cores. Many tests spend their time
# waiting on an event (an outage, a timeout, a stop) rather than
# computing, and the cores idled under them: on 2 cores the plain suite
# took 333 s at -j2, 273 s at -j3 and 238 s at -j4, every test passing.
TEST_JOBS  ?= $(shell echo $$(($(JOBS) + 2)))

# CPU hogs beside the suite in `make test-loaded`.
HOGS       ?= 2

.PHONY: all deps build build-release test test-loaded test-asan test-fuzz fuzz test-containers demo clean

all: build

deps:
	@scripts/install-deps.sh

$(BUILD)/CMakeCache.txt: | deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo

build: deps $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

# An optimized build (-O3, Release) next to the default RelWithDebInfo (-O2)
# and the sanitizer build's Debug (-O0): gcc's flow warnings
# (-Wdangling-pointer, -Wmaybe-uninitialized, -Wstringop-*) depend on how
# much it inlines, so each level finds its own. Built, not tested: about
# 2 minutes from scratch on 2 cores, seconds when nothing changed.
build-release: deps
	cmake -S . -B $(BUILD_RELEASE) -DCMAKE_BUILD_TYPE=Release >/dev/null
	cmake --build $(BUILD_RELEASE) -j $(JOBS)

# Every test, then the coordinator tests once more under ASan + UBSan, and
# each fuzz harness for a few seconds; the Release build must compile
# without warnings too. Each test has its own generous TIMEOUT
# (tests/CMakeLists.txt); --timeout is the default of one without.
test: build build-release test-asan test-fuzz
	ctest --test-dir $(BUILD) --output-on-failure -j $(TEST_JOBS) --timeout 900

# `make test` beside HOGS processes that each keep a core busy, as on a
# loaded machine; prints the time it took and the load it ran under.
test-loaded:
	HOGS=$(HOGS) JOBS=$(JOBS) scripts/test-loaded.sh

# The sanitizer build is CPU-only: ASan's shadow mapping and the CUDA
# runtime do not mix, and the plain build already compiles the GPU path.
test-asan: deps
	cmake -S . -B $(BUILD_ASAN) -DCMAKE_BUILD_TYPE=Debug -DGS_SANITIZE=ON -DGS_CUDA=OFF >/dev/null
	cmake --build $(BUILD_ASAN) -j $(JOBS)
	ctest --test-dir $(BUILD_ASAN) --output-on-failure -j $(TEST_JOBS) --timeout 900 -L asan

# The libFuzzer harnesses (tests/fuzz/, clang): each over its corpus and
# saved crashes, then fuzzing FUZZ_TEST_SECONDS (make test) or FUZZ_SECONDS
# (make fuzz) each. Skipped with a line saying why when clang's libFuzzer
# is missing.
test-fuzz: deps
	JOBS=$(JOBS) tests/fuzz/run.sh $(FUZZ_TEST_SECONDS) $(BUILD_FUZZ)

fuzz: deps
	JOBS=$(JOBS) tests/fuzz/run.sh $(FUZZ_SECONDS) $(BUILD_FUZZ)

# The images (docker/): builds them with podman or docker and trains the demo
# job in containers, by hand and with docker/compose.yaml. Installs podman,
# debootstrap and podman-compose first (scripts/install-deps.sh --containers).
test-containers:
	@scripts/install-deps.sh --containers
	tests/containers/run.sh

demo: build
	scripts/demo.sh $(BUILD)

clean:
	rm -rf $(BUILD) $(BUILD_ASAN) $(BUILD_FUZZ) $(BUILD_RELEASE)
