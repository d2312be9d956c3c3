/* The harnesses' scratch file (fuzz.h): the loaders under test read files,
 * so each input is written to one file, made once per process and removed
 * at exit. */
#include <stdbool.h>
#include <unistd.h>

#include "fuzz.h"

static char scratch_path[] = "/tmp/gs-fuzz-XXXXXX";

static void remove_scratch(void)
{
  unlink(scratch_path);
}

const char *fuzz_scratch_write(const uint8_t *data, size_t size)
{
  static bool made;
  FILE *f;

  if (!made) {
    int fd = mkstemp(scratch_path);

    GS_FUZZ_CHECK(fd >= 0);
    close(fd);
    GS_FUZZ_CHECK(atexit(remove_scratch) == 0);
    made = true;
  }
  f = fopen(scratch_path, "wb");
  GS_FUZZ_CHECK(f != NULL);
  GS_FUZZ_CHECK(fwrite(data, 1, size, f) == size);
  fclose(f);
  return scratch_path;
}
