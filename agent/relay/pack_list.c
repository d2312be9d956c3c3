/* The node's pack list, fetched once per generation (see
 * relay_internal.h): the first rank's FetchPackList goes up, and every
 * rank of the node is answered from its reply. */
#include <stdio.h>
#include <string.h>

#include "relay_internal.h"

/* Answers a waiter from the kept reply: its request id in place of the asker's. */
static void answer_pack_list(gs_relay_t *r, uint32_t slot, uint64_t request_id)
{
  gradsync_Envelope env = r->pl.reply;
  local_t *l = slot <= MAX_SLOT ? r->slots[slot] : NULL;

  if (!l)
    return;
  env.request_id = request_id;
  gs__relay_send_frame(r, (uv_stream_t *)&l->pipe, &env, r->pl.body.data, r->pl.body.len);
}

/* A local FetchPackList: answered from the kept list, or sent up once and
 * answered to everyone who asked when the reply comes. False when it is
 * for another generation than the one kept (it goes up on its own). */
bool gs__relay_pack_list_fetch(gs_relay_t *r, local_t *l, const gradsync_Envelope *env,
                               const gs_buf_t *body)
{
  gradsync_FetchPackListRequest req = gradsync_FetchPackListRequest_init_zero;
  pack_list_t *pl = &r->pl;

  if (gs_wire_decode(body->data, body->len, gradsync_FetchPackListRequest_fields, &req, NULL, 0))
    return false;
  if (strcmp(req.job, pl->job) || req.generation != pl->generation) {
    if (pl->asked && !pl->have)
      return false; /* one generation at a time */
    snprintf(pl->job, sizeof(pl->job), "%s", req.job);
    pl->generation = req.generation;
    pl->asked = pl->have = false;
    pl->nwaiters = 0;
  }
  if (pl->have) {
    answer_pack_list(r, l->slot, env->request_id);
    return true;
  }
  if (pl->asked) {
    if (pl->nwaiters == MAX_SLOT)
      return false;
    pl->waiters[pl->nwaiters++] = (struct waiter){l->slot, env->request_id};
    return true;
  }
  pl->asked = true;
  pl->asker_slot = l->slot;
  pl->asker_id = env->request_id;
  return false; /* the asker's own call goes up */
}

/* The reply to the node's pack-list fetch (`env`, slot 0, with `body`):
 * kept (when OK) and handed to every rank that waits for it. */
void gs__relay_pack_list_reply(gs_relay_t *r, const gradsync_Envelope *env, const gs_buf_t *body)
{
  pack_list_t *pl = &r->pl;

  pl->body.len = 0;
  if (gs_buf_append(&pl->body, body->data, body->len))
    return;
  pl->reply = *env;
  pl->have = env->status == 0;
  pl->asked = false;
  for (uint32_t i = 0; i < pl->nwaiters; i++)
    answer_pack_list(r, pl->waiters[i].slot, pl->waiters[i].request_id);
  pl->nwaiters = 0;
}
