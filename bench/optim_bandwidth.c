/* optim_bandwidth: the fused optimizers' speed against the memory limit.
 * An element-wise update is bound by the bytes it moves, so each fused
 * optimizer (device/optim.c, through the cpu device's table, as the engine
 * calls it) is timed beside a plain copy (memcpy) that moves the same
 * bytes: SGD with momentum reads param, grad and buffer and writes param
 * and buffer (5 floats an element), so its anchor copies 2.5 floats an
 * element (a copy reads and writes each byte once).
 *
 *   optim_bandwidth [--elements N,...] [--rounds R]
 *
 * One line per optimizer and size: the bytes moved per update, the
 * fastest round's time, GB/s, the copy's GB/s and the ratio (1.0 is the
 * limit). The sizes default to the reference MLP's packs (784-256-128-10,
 * 235,146 floats: cache-resident) and the large MLP's (784-1024-1024-10,
 * 1,863,690 floats: memory). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "device.h"

#define MAX_SIZES 8

typedef struct {
  const char *name;
  gs_optim_kind_t kind;
  double momentum;
  bool nesterov, amsgrad;
  unsigned moved; /* floats read and written per element */
} row_t;

static const row_t rows[] = {
    {"sgd", GS_OPTIM_SGD, 0.0, false, false, 3},
    {"sgd-momentum", GS_OPTIM_SGD, 0.9, false, false, 5},
    {"sgd-nesterov", GS_OPTIM_SGD, 0.9, true, false, 5},
    {"adam", GS_OPTIM_ADAM, 0.0, false, false, 7},
    {"adamw", GS_OPTIM_ADAMW, 0.0, false, false, 7},
    {"adamw-amsgrad", GS_OPTIM_ADAMW, 0.0, false, true, 9},
};

static double fastest_ns(double best, uint64_t t0, unsigned reps)
{
  double ns = (double)(gs_now_ns() - t0) / reps;

  return best == 0 || ns < best ? ns : best;
}

/* Times one optimizer on `n` elements and its copy anchor; prints a line. */
static int run_row(gs_device_t *dev, const row_t *r, size_t n, unsigned rounds)
{
  gs_optim_group_t g;
  gs_optim_segment_t seg = {.offset = 0, .count = n, .group = 0};
  float *buf[5] = {0}, *state[3];
  size_t copy_bytes = (size_t)r->moved * n * sizeof(float) / 2;
  char *src = malloc(copy_bytes), *dst = malloc(copy_bytes);
  /* About 50 MB of traffic a round, at least one update. */
  unsigned reps = (unsigned)(50e6 / ((double)r->moved * n * sizeof(float))) + 1;
  double upd = 0, cpy = 0;
  int err = 0;

  gs_optim_group_default(r->kind, &g);
  g.momentum = r->momentum;
  g.nesterov = r->nesterov;
  g.amsgrad = r->amsgrad;
  for (int i = 0; i < 5; i++)
    buf[i] = gs_device_alloc(dev, n * sizeof(float));
  if (!src || !dst || !buf[4]) {
    fprintf(stderr, "optim_bandwidth: out of memory at %zu elements\n", n);
    err = 1;
    goto out_free;
  }
  memset(src, 1, copy_bytes);
  for (size_t i = 0; i < n; i++)
    buf[1][i] = (float)(i % 97) * 1e-3f; /* grads: finite, varied */
  memcpy(state, &buf[2], sizeof(state));
  for (unsigned k = 0; k < rounds; k++) {
    gs_optim_step_t st = {.kind = r->kind, .groups = &g, .ngroups = 1, .grad_scale = 0.5f};
    uint64_t t0 = gs_now_ns();

    for (unsigned j = 0; j < reps; j++) {
      st.t = 2 + j; /* past the first step: the buffers are read */
      gs_device_optim_pack(dev, &st, &seg, 1, buf[0], buf[1], state);
    }
    upd = fastest_ns(upd, t0, reps);
    t0 = gs_now_ns();
    for (unsigned j = 0; j < reps; j++) {
      memcpy(dst, src, copy_bytes);
      __asm__ volatile("" : : "r"(dst) : "memory"); /* each copy happens */
    }
    cpy = fastest_ns(cpy, t0, reps);
  }
  {
    double bytes = 2.0 * (double)copy_bytes;

    printf("%-14s %10zu elements %8.2f MB %9.1f us %7.1f GB/s  copy %7.1f GB/s  %5.2fx the "
           "copy\n",
           r->name, n, bytes / 1e6, upd / 1e3, bytes / upd, bytes / cpy, cpy / upd);
  }
out_free:
  for (int i = 0; i < 5; i++)
    gs_device_free(dev, buf[i]);
  free(src);
  free(dst);
  return err;
}

static int parse_sizes(const char *s, size_t *out, int *count)
{
  char *end;

  for (*count = 0; *s && *count < MAX_SIZES; s = *end ? end + 1 : end) {
    unsigned long long v = strtoull(s, &end, 10);

    if (end == s || v == 0 || v > (1ULL << 32) || (*end && *end != ','))
      return -1;
    out[(*count)++] = (size_t)v;
  }
  return *count ? 0 : -1;
}

int main(int argc, char **argv)
{
  size_t sizes[MAX_SIZES] = {235146, 1863690};
  int nsizes = 2, rounds = 5, err = 0;
  char why[200];
  gs_device_t *dev;

  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--elements") == 0 && i + 1 < argc) {
      if (parse_sizes(argv[++i], sizes, &nsizes)) {
        fprintf(stderr, "optim_bandwidth: --elements takes counts like 235146,1863690\n");
        return 2;
      }
    } else if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc) {
      rounds = atoi(argv[++i]);
      if (rounds < 1) {
        fprintf(stderr, "optim_bandwidth: --rounds takes a count >= 1\n");
        return 2;
      }
    } else {
      printf("usage: optim_bandwidth [--elements N,...] [--rounds R]\n"
             "Times each fused optimizer of the cpu device beside a memcpy moving the same\n"
             "bytes (the memory limit); the fastest of R rounds (default 5).\n");
      return strcmp(argv[i], "--help") == 0 ? 0 : 2;
    }
  }
  dev = gs_device_open("cpu", 0, NULL, why, sizeof(why));
  if (!dev) {
    fprintf(stderr, "optim_bandwidth: %s\n", why);
    return 1;
  }
  for (int s = 0; s < nsizes && !err; s++)
    for (size_t r = 0; r < sizeof(rows) / sizeof(rows[0]) && !err; r++)
      err = run_row(dev, &rows[r], sizes[s], (unsigned)rounds);
  gs_device_destroy(dev);
  return err;
}
