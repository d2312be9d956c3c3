/* mpi_allreduce: the Open MPI anchor for bench/allreduce_bench.c. Same
 * sizes, same procedure (one checked allreduce, fixed warm-up, rank 0 sizes
 * the timed loop and broadcasts the count) and the same output lines, with
 * MPI_Allreduce in place on float32. Built by bench/allreduce_vs_mpi.sh with
 * mpicc (not by CMake: MPI is only a benchmark dependency); run it under
 * mpirun, whose --mca btl option picks the transport being measured.
 *
 *   mpirun -n 2 --mca btl tcp,self mpi_allreduce [--min S] [--max S]
 *       [--factor K] [--time SECS] [--csv] [--label NAME] */
#include <mpi.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct opts {
  unsigned long long min_bytes, max_bytes, factor;
  double target_s;
  bool csv;
  const char *label;
} opts_t;

/* "4096", "64KiB", "16MiB", "1GiB". */
static int parse_size(const char *s, unsigned long long *out)
{
  char *end;
  unsigned long long v = strtoull(s, &end, 10);

  if (end == s)
    return -1;
  if (strcmp(end, "KiB") == 0 || strcmp(end, "K") == 0)
    v <<= 10;
  else if (strcmp(end, "MiB") == 0 || strcmp(end, "M") == 0)
    v <<= 20;
  else if (strcmp(end, "GiB") == 0 || strcmp(end, "G") == 0)
    v <<= 30;
  else if (*end && strcmp(end, "B") != 0)
    return -1;
  *out = v;
  return 0;
}

static int parse_opts(int argc, char **argv, opts_t *o)
{
  *o = (opts_t){4096, 256ull << 20, 4, 0.3, false, "mpi"};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;

    if (strcmp(a, "--csv") == 0) {
      o->csv = true;
      continue;
    }
    if (strcmp(a, "--help") == 0)
      return 1;
    if (!v)
      return -1;
    i++;
    if (strcmp(a, "--min") == 0      ? parse_size(v, &o->min_bytes)
        : strcmp(a, "--max") == 0    ? parse_size(v, &o->max_bytes)
        : strcmp(a, "--factor") == 0 ? parse_size(v, &o->factor)
        : strcmp(a, "--time") == 0   ? ((o->target_s = atof(v)) > 0 ? 0 : -1)
        : strcmp(a, "--label") == 0  ? ((o->label = v), 0)
                                     : -1)
      return -1;
  }
  return o->min_bytes >= 4 && o->min_bytes <= o->max_bytes && o->factor >= 2 ? 0 : -1;
}

static float value(int rank, size_t i)
{
  return (float)((int)((i * 13 + (size_t)rank * 7) % 23) - 11);
}

static void run_size(float *buf, size_t n, const opts_t *o, int rank, int world)
{
  size_t bytes = n * sizeof(float);
  int ok = 1, all_ok, warm = bytes <= (1u << 20) ? 20 : bytes <= (16u << 20) ? 5 : 2;
  unsigned long long iters;
  double t0, per, sec, algbw, busbw;

  for (size_t i = 0; i < n; i++)
    buf[i] = value(rank, i);
  MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  for (size_t i = 0; i < n && ok; i++) {
    double want = 0;

    for (int r = 0; r < world; r++)
      want += value(r, i);
    ok = buf[i] == (float)want;
  }
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  memset(buf, 0, bytes);
  t0 = MPI_Wtime();
  for (int i = 0; i < warm; i++)
    MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  per = (MPI_Wtime() - t0) / warm;
  iters = (unsigned long long)(o->target_s / per);
  iters = iters < 3 ? 3 : iters > 1000000 ? 1000000 : iters;
  MPI_Bcast(&iters, 1, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD);
  t0 = MPI_Wtime();
  for (unsigned long long i = 0; i < iters; i++)
    MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  sec = (MPI_Wtime() - t0) / (double)iters;
  if (rank != 0)
    return;
  algbw = (double)bytes / sec / 1e9;
  busbw = algbw * 2.0 * (world - 1) / world;
  if (o->csv)
    printf("%s,%d,%zu,%.2f,%.3f,%.3f,%s\n", o->label, world, bytes, sec * 1e6, algbw, busbw,
           all_ok ? "yes" : "no");
  else
    printf("%12zu %12.2f %10.3f %10.3f  %s\n", bytes, sec * 1e6, algbw, busbw,
           all_ok ? "yes" : "no");
  fflush(stdout);
}

int main(int argc, char **argv)
{
  int rank, world, rc;
  float *buf;
  opts_t o;

  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  rc = parse_opts(argc, argv, &o);
  if (rc) {
    if (rank == 0)
      fprintf(rc > 0 ? stdout : stderr,
              "usage: mpirun -n N mpi_allreduce [--min S] [--max S] [--factor K] [--time SECS]"
              " [--csv] [--label NAME]\n");
    MPI_Finalize();
    return rc > 0 ? 0 : 2;
  }
  buf = malloc(o.max_bytes);
  if (!buf)
    MPI_Abort(MPI_COMM_WORLD, 1);
  if (rank == 0 && !o.csv)
    printf("# %s MPI_Allreduce, %d ranks, float32 sum\n# %10s %12s %10s %10s  %s\n", o.label, world,
           "bytes", "time_us", "algbw_GB/s", "busbw_GB/s", "correct");
  for (unsigned long long b = o.min_bytes; b <= o.max_bytes; b *= o.factor)
    run_size(buf, (size_t)(b / sizeof(float)), &o, rank, world);
  free(buf);
  MPI_Finalize();
  return 0;
}
