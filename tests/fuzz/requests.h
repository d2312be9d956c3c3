/* Every request message decoded the way the coordinator's RPC layer
 * (coordinator/rpc.c) decodes it: nanopb through gs_wire_decode, with the
 * repeated fields bound to bounded arrays (common/pb_array.h). Shared by
 * the message and dispatch harnesses. */
#ifndef GS_FUZZ_REQUESTS_H
#define GS_FUZZ_REQUESTS_H

#include "job_store.h"
#include "packlist.h"
#include "pb_array.h"
#include "wire.h"

/* As rpc.c bounds them. */
#define FUZZ_MAX_SETTINGS 64
#define FUZZ_MAX_PARAMS (1u << 20)

typedef struct fuzz_request {
  gs_method_t method;
  union {
    gradsync_JoinRequest join;
    gradsync_PublishRequest publish;
    gradsync_FetchRequest fetch;
    gradsync_PublishPackListRequest publish_pack_list;
    gradsync_FetchPackListRequest fetch_pack_list;
    gradsync_HeartbeatRequest heartbeat;
    gradsync_LeaveRequest leave;
  } u;
  gs_pb_array_t settings, params, sizes, order;
} fuzz_request_t;

/* The message type of method `m` (NULL for Batch, which carries whole
 * Envelopes: fuzz_messages.c walks them). */
const pb_msgdesc_t *fuzz_request_fields(gs_method_t m);
/* Decodes `len` bytes as the request of method `m` into `rq` (its arrays
 * bound); free with fuzz_request_free whatever it returns. */
int fuzz_request_decode(fuzz_request_t *rq, gs_method_t m, const uint8_t *data, size_t len);
/* Binds the arrays for encoding `rq` again. */
void fuzz_request_bind_encode(fuzz_request_t *rq);
void fuzz_request_free(fuzz_request_t *rq);
/* The job name the request carries. */
const char *fuzz_request_job(const fuzz_request_t *rq);

/* rpc.c's check of a published pack list: validates it against its params
 * and, when valid, encodes the FetchPackListResponse body and the summary. */
int fuzz_pack_list_check(fuzz_request_t *rq, gs_buf_t *body, gs_pack_summary_t *sum, char *why,
                         size_t why_len);

#endif
