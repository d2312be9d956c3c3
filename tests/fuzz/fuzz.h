/* What every fuzz harness provides: libFuzzer's entry point. Built twice:
 * with clang's -fsanitize=fuzzer (GS_FUZZ, tests/fuzz/CMakeLists.txt), and
 * with replay_main.c as a plain program that runs saved inputs (the seed
 * corpus and tests/fuzz/regressions/) through the same function with any
 * compiler. A harness aborts (GS_FUZZ_CHECK) when an invariant fails, so
 * both builds report it as a crash. The entry point takes no context, so
 * what a harness keeps across inputs (a scratch file, a loop) is static:
 * the one place where the project has mutable globals. */
#ifndef GS_FUZZ_H
#define GS_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Writes the input to the process's scratch file (scratch.c) and returns
 * its path: for the harnesses whose loaders read files. */
const char *fuzz_scratch_write(const uint8_t *data, size_t size);

#define GS_FUZZ_CHECK(cond)                                                                        \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      fprintf(stderr, "%s:%d: fuzz invariant failed: %s\n", __FILE__, __LINE__, #cond);            \
      abort();                                                                                     \
    }                                                                                              \
  } while (0)

#endif
