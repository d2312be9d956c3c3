/* Checkpoint files (agent/engine/checkpoint.c): the input is written to a
 * file and loaded against a fixed expected layout (hash 0x5eed, two
 * buffers of 3 and 2 floats, description "fuzz"). When the input's first
 * byte is odd, the harness first writes the correct CRC into the trailer
 * (the last 12 bytes), so the fuzzer gets past the CRC to the parse after
 * it. A load that succeeds must have filled the buffers from the file. */
#include <stdbool.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "checkpoint.h"
#include "fuzz.h"

#define TRAILER_LEN 12

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  const char *path;
  float a[3] = {-1, -1, -1}, b[2] = {-1, -1};
  gs_ckpt_buffer_t bufs[2] = {{a, 3}, {b, 2}};
  gs_ckpt_state_t st = {.layout_hash = 0x5eed, .nbuf = 2, .bufs = bufs, .desc = "fuzz"};
  uint8_t *copy = calloc(size ? size : 1, 1);
  char why[512];

  if (!copy)
    return 0;
  if (size)
    memcpy(copy, data, size);
  if (size >= TRAILER_LEN && (data[0] & 1)) {
    uint32_t crc = (uint32_t)crc32(0, copy, (uInt)(size - TRAILER_LEN));

    for (int i = 0; i < 4; i++)
      copy[size - TRAILER_LEN + i] = (uint8_t)(crc >> (8 * i));
  }
  path = fuzz_scratch_write(copy, size); /* not named like a checkpoint: no step check */
  if (gs_checkpoint_load_file(path, &st, why, sizeof(why)) == 0) {
    GS_FUZZ_CHECK(size >= 48 + 2 * 8 + 5 * 4 + TRAILER_LEN);
    GS_FUZZ_CHECK(!memcmp(a, copy + 48 + 8, sizeof(a)) &&
                  !memcmp(b, copy + 48 + 8 + 12 + 8, sizeof(b)));
  } else {
    GS_FUZZ_CHECK(strstr(why, path) != NULL);
  }
  free(copy);
  return 0;
}
