/* Runs saved inputs through a harness's LLVMFuzzerTestOneInput without
 * libFuzzer, so the corpus and the regression inputs are checked by any
 * compiler's build (tests/fuzz/CMakeLists.txt, ctest fuzz_replay_*).
 * Arguments are files or folders (every regular file in them, sorted is not
 * needed: each input stands alone). Exits 1 when an argument cannot be
 * read, 0 when every input ran; a failed invariant aborts. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"

static int run_file(const char *path, unsigned *runs)
{
  FILE *f = fopen(path, "rb");
  uint8_t *data = NULL;
  long len;

  if (!f || fseek(f, 0, SEEK_END) != 0 || (len = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0)
    goto out_fail;
  data = malloc(len ? (size_t)len : 1);
  if (!data || fread(data, 1, (size_t)len, f) != (size_t)len)
    goto out_fail;
  fclose(f);
  /* An exact-size copy, so ASan sees any read past the input. */
  LLVMFuzzerTestOneInput(data, (size_t)len);
  free(data);
  (*runs)++;
  return 0;
out_fail:
  fprintf(stderr, "replay: cannot read %s\n", path);
  free(data);
  if (f)
    fclose(f);
  return 1;
}

static int run_path(const char *path, unsigned *runs)
{
  struct stat sb;
  struct dirent *e;
  DIR *d;
  int bad = 0;

  if (stat(path, &sb) != 0) {
    fprintf(stderr, "replay: no such file or folder: %s\n", path);
    return 1;
  }
  if (!S_ISDIR(sb.st_mode))
    return run_file(path, runs);
  d = opendir(path);
  if (!d)
    return 1;
  while ((e = readdir(d)) != NULL) {
    char child[4096];

    if (e->d_name[0] == '.')
      continue;
    snprintf(child, sizeof(child), "%s/%s", path, e->d_name);
    bad |= run_path(child, runs);
  }
  closedir(d);
  return bad;
}

int main(int argc, char **argv)
{
  unsigned runs = 0;
  int bad = 0;

  for (int i = 1; i < argc; i++)
    bad |= run_path(argv[i], &runs);
  printf("replay: %u inputs ran\n", runs);
  return bad || runs == 0;
}
