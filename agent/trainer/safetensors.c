/* The safetensors writer (see safetensors.h). */
#include "safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <libgen.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "byteorder.h"
#include "fileio.h"
#include "why.h"

/* The floats go to disk as they lie in memory. */
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c writes float32 data as it lies in memory: it needs a little-endian host"
#endif

#define ST_ALIGN 8 /* the header is padded with spaces so the data starts 8-byte aligned */

static int sys_fail(char *why, size_t why_len, const char *path, const char *call)
{
  int e = errno;

  gs_set_why(why, why_len, "%s: %s: %s", path, call, strerror(e));
  return gs_err_from_errno(e);
}

static uint64_t tensor_bytes(const gs_st_tensor_t *t)
{
  uint64_t n = sizeof(float);

  for (uint32_t d = 0; d < t->ndims; d++)
    n *= t->shape[d];
  return n;
}

static int check_tensors(const gs_st_tensor_t *t, size_t n, char *why, size_t why_len)
{
  for (size_t i = 0; i < n; i++) {
    if (!t[i].name || !t[i].name[0] || !strcmp(t[i].name, "__metadata__"))
      return gs_why(GS_EINVAL, why, why_len, "tensor %zu has no usable name", i);
    if (t[i].ndims < 1 || t[i].ndims > GS_ST_MAX_DIMS)
      return gs_why(GS_EINVAL, why, why_len, "tensor '%s' has %u dims (1..%d)", t[i].name,
                    t[i].ndims, GS_ST_MAX_DIMS);
    for (size_t j = 0; j < i; j++)
      if (!strcmp(t[i].name, t[j].name))
        return gs_why(GS_EINVAL, why, why_len, "tensor '%s' given twice", t[i].name);
  }
  return 0;
}

/* The JSON header, unpadded; NULL when out of memory. Caller frees. */
static char *header_json(const gs_st_tensor_t *t, size_t n, const gs_st_meta_t *meta, size_t nmeta)
{
  cJSON *root = cJSON_CreateObject(), *o, *shape, *offs, *m;
  uint64_t at = 0;
  char *s = NULL;

  if (!root)
    return NULL;
  for (size_t i = 0; i < n; i++) {
    uint64_t len = tensor_bytes(&t[i]);

    o = cJSON_AddObjectToObject(root, t[i].name);
    if (!o || !cJSON_AddStringToObject(o, "dtype", "F32"))
      goto out;
    shape = cJSON_AddArrayToObject(o, "shape");
    offs = cJSON_AddArrayToObject(o, "data_offsets");
    if (!shape || !offs)
      goto out;
    /* Doubles hold integers exactly up to 2^53 bytes: far past any model here. */
    for (uint32_t d = 0; d < t[i].ndims; d++)
      cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t[i].shape[d]));
    cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)at));
    cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)(at + len)));
    at += len;
  }
  if (nmeta) {
    m = cJSON_AddObjectToObject(root, "__metadata__");
    for (size_t i = 0; m && i < nmeta; i++)
      if (!cJSON_AddStringToObject(m, meta[i].key, meta[i].value))
        goto out;
    if (!m)
      goto out;
  }
  s = cJSON_PrintUnformatted(root);
out:
  cJSON_Delete(root);
  return s;
}

/* Length prefix, padded header, then each tensor's bytes. */
static int write_file(int fd, const char *tmp, const char *json, const gs_st_tensor_t *t, size_t n,
                      char *why, size_t why_len)
{
  size_t len = strlen(json), padded = (len + ST_ALIGN - 1) / ST_ALIGN * ST_ALIGN;
  uint8_t prefix[8];
  char *hdr = malloc(padded ? padded : 1);

  if (!hdr)
    return gs_why(GS_ENOMEM, why, why_len, "%s: out of memory for the header", tmp);
  memcpy(hdr, json, len);
  memset(hdr + len, ' ', padded - len);
  gs_store_le64(prefix, padded);
  if (gs_write_all(fd, prefix, sizeof(prefix)) || gs_write_all(fd, hdr, padded)) {
    free(hdr);
    return sys_fail(why, why_len, tmp, "write");
  }
  free(hdr);
  for (size_t i = 0; i < n; i++)
    if (gs_write_all(fd, t[i].data, (size_t)tensor_bytes(&t[i])))
      return sys_fail(why, why_len, tmp, "write");
  if (fsync(fd) != 0)
    return sys_fail(why, why_len, tmp, "fsync");
  return 0;
}

int gs_safetensors_write(const char *path, const gs_st_tensor_t *t, size_t n,
                         const gs_st_meta_t *meta, size_t nmeta, char *why, size_t why_len)
{
  char tmp[PATH_MAX], dir[PATH_MAX];
  char *json;
  int fd, err;

  err = check_tensors(t, n, why, why_len);
  if (err)
    return err;
  if (snprintf(tmp, sizeof(tmp), "%s.tmp", path) >= (int)sizeof(tmp))
    return gs_why(GS_EINVAL, why, why_len, "%s: path too long", path);
  json = header_json(t, n, meta, nmeta);
  if (!json)
    return gs_why(GS_ENOMEM, why, why_len, "%s: out of memory for the header", path);
  fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    free(json);
    return sys_fail(why, why_len, tmp, "open");
  }
  err = write_file(fd, tmp, json, t, n, why, why_len);
  free(json);
  if (close(fd) != 0 && !err)
    err = sys_fail(why, why_len, tmp, "close");
  if (!err && rename(tmp, path) != 0)
    err = sys_fail(why, why_len, path, "rename");
  if (err) {
    unlink(tmp);
    return err;
  }
  /* The rename is durable once the directory is. */
  snprintf(dir, sizeof(dir), "%s", path);
  fd = open(dirname(dir), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    fsync(fd);
    close(fd);
  }
  return 0;
}
