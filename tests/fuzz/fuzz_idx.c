/* IDX files (agent/trainer/idx.c): the input as an uncompressed image
 * (gs_idx_parse), and as a file on disk (gs_idx_load, which gunzips what
 * starts with the gzip magic). A parsed image's data must be as long as
 * its dimensions say, and both ways must agree on plain input. */
#include <stdbool.h>
#include <string.h>
#include <unistd.h>

#include "fuzz.h"
#include "idx.h"

static void check_image(const gs_idx_t *idx, const uint8_t *data, size_t size)
{
  size_t n = 1;

  GS_FUZZ_CHECK(idx->ndims >= 1 && idx->ndims <= 4);
  for (uint32_t i = 0; i < idx->ndims; i++)
    n *= idx->dims[i];
  GS_FUZZ_CHECK(n <= size);
  if (n) /* the data are the input's last n bytes or fewer: touch them all */
    GS_FUZZ_CHECK(memcmp(idx->data, data + 4 + 4 * idx->ndims, n) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  const char *path;
  gs_idx_t a = {0}, b = {0};
  char why[256];
  int ra, rb;

  ra = gs_idx_parse(data, size, &a, why, sizeof(why));
  if (ra == 0)
    check_image(&a, data, size);
  path = fuzz_scratch_write(data, size);
  rb = gs_idx_load(path, &b, why, sizeof(why));
  if (rb != 0)
    GS_FUZZ_CHECK(strstr(why, path) != NULL); /* errors name the file */
  if (size < 2 || data[0] != 0x1f || data[1] != 0x8b) {
    GS_FUZZ_CHECK((ra == 0) == (rb == 0));
    if (ra == 0)
      GS_FUZZ_CHECK(a.ndims == b.ndims && !memcmp(a.dims, b.dims, sizeof(a.dims)));
  }
  gs_idx_free(&a);
  gs_idx_free(&b);
  return 0;
}
