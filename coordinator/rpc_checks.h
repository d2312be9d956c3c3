/* The RPC layer's checks of request contents, as pure functions of the
 * decoded (or encoded) bytes: no transport, no loop, so the fuzz harnesses
 * call the very code rpc.c runs. */
#ifndef GS_RPC_CHECKS_H
#define GS_RPC_CHECKS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "gradsync.pb.h"
#include "job_store.h"
#include "pb_array.h"

/* Job names appear in URLs and logs: letters, digits, '-', '_', '.'. */
bool gs__job_name_ok(const char *name);

/* The wire arrays of a PackList. */
typedef struct gs_pack_list_arrays {
  gs_pb_array_t params, sizes, order;
} gs_pack_list_arrays_t;

/* Binds a PackList's repeated fields for decoding into `a`, each array at
 * most `max` entries. Free with gs__pack_list_free. */
void gs__pack_list_bind(gradsync_PackList *pl, gs_pack_list_arrays_t *a, uint32_t max);
void gs__pack_list_free(gs_pack_list_arrays_t *a);

/* Validates a decoded pack list; on success encodes the FetchPackList
 * reply body into `body` and fills `sum`. 0, or a negative code with the
 * reason in `why`. */
int gs__pack_list_check(const gradsync_PackList *pl, gs_pack_list_arrays_t *a, gs_buf_t *body,
                        gs_pack_summary_t *sum, char *why, size_t why_len);

/* How many params an encoded PublishPackListRequest carries, counted
 * without storing any; false (with the reason) when it does not decode. */
bool gs__pack_list_count(const uint8_t *data, size_t len, size_t *count, char *why, size_t why_len);

#endif
