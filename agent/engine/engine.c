/* The sync engine's lifecycle: new, start (open the device and the
 * client, then enter the first generation: generation.c), the accessors,
 * finish and free. The step, the comm thread, the syncs outside a step
 * and elastic regroups have their own files (engine_internal.h). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_internal.h"
#include "why.h"

/* The final Leave waits at least this long (--coordinator-grace may be 0). */
#define LEAVE_MIN_MS 2000

/* A copy of `s` in *copy (NULL stays NULL); false when out of memory. */
static bool copy_string(const char *s, char **copy)
{
  *copy = s ? strdup(s) : NULL;
  return !s || *copy;
}

/* The copies gs_engine_new made of the config's strings. */
static void free_strings(gs_engine_t *e)
{
  free(e->job);
  free(e->token);
  free(e->checkpoint_dir);
  free(e->tls_ca);
  free(e->tls_cert);
  free(e->tls_key);
}

gs_engine_t *gs_engine_new(const gs_engine_config_t *cfg)
{
  gs_engine_t *e = calloc(1, sizeof(*e));

  if (!e)
    return NULL;
  e->cfg = *cfg;
  if (!copy_string(cfg->coord.job, &e->job) || !copy_string(cfg->coord.token, &e->token) ||
      !copy_string(cfg->checkpoint_dir, &e->checkpoint_dir) ||
      !copy_string(cfg->coord.tls_ca, &e->tls_ca) ||
      !copy_string(cfg->coord.tls_cert, &e->tls_cert) ||
      !copy_string(cfg->coord.tls_key, &e->tls_key)) {
    free_strings(e);
    free(e);
    return NULL;
  }
  e->cfg.coord.job = e->job;
  e->cfg.coord.token = e->token;
  e->cfg.coord.tls_ca = e->tls_ca;
  e->cfg.coord.tls_cert = e->tls_cert;
  e->cfg.coord.tls_key = e->tls_key;
  e->cfg.checkpoint_dir = e->checkpoint_dir;
  e->log = (gs_log_t){GS_LOG_INFO, NULL, "gradsync"};
  if (!e->cfg.log)
    e->cfg.log = &e->log;
  if (!e->cfg.coord.log)
    e->cfg.coord.log = e->cfg.log;
  e->repeated_param = -1;
  e->step_factor = 1.0f;
  e->lr_scale = e->operator_lr_scale = 1.0f; /* until a Join says */
  gs_packs_init(&e->packs);
  if (gs__engine_groups_init(e)) {
    gs__engine_groups_free(e);
    free_strings(e);
    free(e);
    return NULL;
  }
  gs__ckpt_writer_init(&e->ckpt_writer, e->cfg.checkpoint_dir, e->cfg.checkpoint_keep,
                       e->cfg.checkpoint_failures, e->cfg.log, e->cfg.coord.job);
  gs__comm_thread_init(&e->ct);
  return e;
}

const char *gs_engine_error(const gs_engine_t *e)
{
  return e->error[0] ? e->error : "no error";
}

const char *gs_engine_strerror(int err)
{
  return gs_strerror(err);
}

int gs_engine_register(gs_engine_t *e, const char *name, uint64_t elements, bool is_bias)
{
  int idx = gs_packs_register(&e->packs, name, elements, is_bias);

  if (idx >= 0)
    e->packs.group_of[idx] = gs__engine_default_group(e, is_bias);
  if (idx < 0)
    gs_set_why(e->error, sizeof(e->error), "cannot register parameter '%s': %s", name ? name : "?",
               gs_strerror(idx));
  return idx;
}

uint32_t gs_engine_rank(const gs_engine_t *e)
{
  return gs__membership_rank(&e->member);
}

uint32_t gs_engine_state_rank(const gs_engine_t *e)
{
  return e->member.join.resume_state ? e->member.join.state_rank : 0;
}

void gs_engine_position(const gs_engine_t *e, gs_position_t *out)
{
  *out = e->committed;
}

bool gs_engine_world_changed(int err)
{
  return err == GS_EREGROUPED;
}

uint32_t gs_engine_world_size(const gs_engine_t *e)
{
  return gs__membership_world(&e->member);
}

uint64_t gs_engine_generation(const gs_engine_t *e)
{
  return gs__membership_generation(&e->member);
}

uint32_t gs_engine_pack_count(const gs_engine_t *e)
{
  return e->packs.list.pack_count;
}

int32_t gs_engine_bcast_period(const gs_engine_t *e)
{
  return e->period;
}

float *gs_engine_param(const gs_engine_t *e, uint32_t i)
{
  return gs_packs_param(&e->packs, i);
}

float *gs_engine_grad(const gs_engine_t *e, uint32_t i)
{
  return gs_packs_grad(&e->packs, i);
}

uint32_t gs_engine_param_pack(const gs_engine_t *e, uint32_t i)
{
  return i < e->packs.nparams && e->packs.pack_of ? e->packs.pack_of[i] : 0;
}

int gs_engine_set_layout_desc(gs_engine_t *e, const char *desc)
{
  char *copy;

  if (e->member.joined || !desc || strlen(desc) > GS_CKPT_DESC_MAX) {
    gs_set_why(e->error, sizeof(e->error), "cannot set the layout description: %s",
               e->member.joined ? "called after start" : "missing or over 4096 bytes");
    return GS_EINVAL;
  }
  copy = strdup(desc);
  if (!copy)
    return GS_ENOMEM;
  free(e->layout_desc);
  e->layout_desc = copy;
  return 0;
}

/* The default layout description: each parameter's name and size, as far
 * as they fit ("params fc1.weight[200704] fc1.bias[256] ..."). */
static int describe_params(gs_engine_t *e)
{
  size_t cap = GS_CKPT_DESC_MAX + 1, used;
  char *d = malloc(cap);

  if (!d)
    return GS_ENOMEM;
  used = (size_t)snprintf(d, cap, "params");
  for (uint32_t i = 0; i < e->packs.nparams; i++) {
    char one[320];
    int n = snprintf(one, sizeof(one), " %s[%" PRIu64 "]", e->packs.params[i].name,
                     e->packs.params[i].elements);

    if (n < 0 || used + (size_t)n + 4 >= cap) {
      snprintf(d + used, cap - used, " ...");
      break;
    }
    memcpy(d + used, one, (size_t)n + 1);
    used += (size_t)n;
  }
  e->layout_desc = d;
  return 0;
}

/* ---- start -------------------------------------------------------------- */
/* The TLS context of coord.tls_*, shared by the client and the heartbeat
 * thread's; made before either dials, so a bad file fails the start. */
static int open_tls(gs_engine_t *e)
{
  const gs_engine_coord_t *c = &e->cfg.coord;
  gs_client_tls_config_t tc = {.ca = c->tls_ca, .cert = c->tls_cert, .key = c->tls_key};
  char why[512];

  if (!c->tls_ca && !c->tls_cert && !c->tls_key)
    return 0;
  e->tls = gs_client_tls_new(&tc, why, sizeof(why));
  if (!e->tls) {
    gs_set_why(e->error, sizeof(e->error), "TLS: %s", why);
    return GS_EINVAL;
  }
  return 0;
}

/* Opens the device cfg.device names ("cpu", "cuda", "cuda:N") for a
 * caller that passed none; gs_engine_free closes it. */
static int open_device(gs_engine_t *e)
{
  const char *name = e->cfg.device[0] ? e->cfg.device : "cpu";
  bool cpu = strcmp(name, "cpu") == 0;
  char why[256];
  int index = 0;

  if (!cpu && strcmp(name, "cuda") != 0 && (sscanf(name, "cuda:%d", &index) != 1 || index < 0)) {
    gs_set_why(e->error, sizeof(e->error), "unknown device '%s' (cpu, cuda or cuda:N)", name);
    return GS_EINVAL;
  }
  e->cfg.dev = gs_device_open(cpu ? "cpu" : "cuda", index, e->cfg.log, why, sizeof(why));
  if (!e->cfg.dev) {
    gs_set_why(e->error, sizeof(e->error), "cannot open device %s: %s", name, why);
    return GS_EUNAVAIL;
  }
  e->owns_dev = true;
  if (!cpu && e->cfg.cuda_stream && gs_device_use_stream(e->cfg.dev, e->cfg.cuda_stream)) {
    gs_set_why(e->error, sizeof(e->error), "cannot queue %s's work on the given CUDA stream", name);
    return GS_EUNAVAIL;
  }
  return 0;
}

int gs_engine_start(gs_engine_t *e)
{
  char comm_addr[256];
  char why[512];
  int err;

  if (e->packs.nparams == 0) {
    gs_set_why(e->error, sizeof(e->error), "no parameters registered");
    return GS_EINVAL;
  }
  if (gs_sgd_config_check(&e->cfg.sgd, why, sizeof(why))) {
    gs_set_why(e->error, sizeof(e->error), "%s", why);
    return GS_EINVAL;
  }
  if (gs__engine_groups_check(e))
    return GS_EINVAL;
  if ((unsigned)e->cfg.grad_dtype > GS_GRAD_FP16) {
    gs_set_why(e->error, sizeof(e->error), "grad dtype %d is none of fp32, bf16 and fp16",
               (int)e->cfg.grad_dtype);
    return GS_EINVAL;
  }
  if (!e->layout_desc && describe_params(e)) {
    gs_set_why(e->error, sizeof(e->error), "out of memory");
    return GS_ENOMEM;
  }
  /* Before the rendezvous: a directory that cannot take a checkpoint must
   * not surface at the first save, after every rank waited and trained. */
  if (e->cfg.checkpoint_dir) {
    err = gs_checkpoint_dir_check(e->cfg.checkpoint_dir, why, sizeof(why));
    if (err) {
      gs_set_why(e->error, sizeof(e->error), "checkpoint directory %s is not usable: %s",
                 e->cfg.checkpoint_dir, why);
      return err;
    }
  }
  if (!e->cfg.dev) {
    err = open_device(e);
    if (err)
      return err;
  }
  err = open_tls(e);
  if (err)
    return err;
  {
    gs_client_config_t cc = gs__engine_client_config(e);

    cc.interrupt = e->cfg.term_flag; /* the waits of start end at a signal; Leave does not */
    e->client = gs_client_new(&cc);
  }
  if (!e->client) {
    gs_set_why(e->error, sizeof(e->error), "out of memory");
    return GS_ENOMEM;
  }
  e->nctl_cap = gs_control_len(e->cfg.world_size); /* room for the largest world */
  err = gs__engine_open_comm(e, comm_addr, sizeof(comm_addr));
  if (err)
    return err;
  err = gs__engine_join(e, comm_addr);
  if (err)
    return err;
  err = gs__engine_start_heartbeat(e);
  err = err ? err : gs__engine_agree_packlist(e);
  err = err ? err : gs__engine_go_live(e);
  /* An elastic world that broke before it trained (a rank lost while the
   * ranks connected) is no failure of this rank: it joins the next one. */
  if (err && gs__engine_elastic(e) && gs__engine_may_regroup(err))
    err = gs__engine_regroup_before_training(e);
  return err;
}

void gs_engine_report(gs_engine_t *e, const gs_progress_t *p)
{
  if (e->hb)
    gs_heartbeat_report(e->hb, p);
}

/* Leaves before the heartbeat connection closes: the coordinator counts a
 * running rank's connection closing as that rank lost. */
void gs_engine_finish(gs_engine_t *e, bool finished, const char *reason)
{
  gs_step_result_t last;
  char why[640];

  /* Late decisions: the last step's, before anything is kept of it. */
  if (gs_engine_drain(e, &last) && finished) {
    finished = false;
    reason = last.stop ? last.stop_reason : "the last step failed";
  }
  /* A run that ends well keeps its model: the last step is checkpointed
   * unless a checkpoint of it was taken already (--checkpoint-every, a stop).
   * Sharded, every rank takes part (its shard of the optimizer state). */
  if (finished && e->cfg.checkpoint_dir &&
      (gs__membership_rank(&e->member) == 0 || gs__engine_sharded(e)) && e->steps_begun &&
      !e->failed && !gs__engine_checkpointed(e, e->after.step) &&
      gs_engine_checkpoint(e, &e->after)) {
    finished = false;
    reason = "the last checkpoint could not be written";
  }
  /* A checkpoint still being written (the one taken at a stop, say) is
   * complete before this rank leaves; the writer logged a failure. */
  if (gs__ckpt_writer_wait(&e->ckpt_writer, why, sizeof(why)) && finished) {
    finished = false;
    reason = "the last checkpoint could not be written";
    gs_set_why(e->error, sizeof(e->error), "%s", why);
  }
  gs__engine_enter(e, GS_PHASE_IDLE, 0);
  gs__engine_comm_stop(e, !finished);
  if (e->member.joined && e->client) {
    /* The rank's last word waits for a coordinator that is slow, stopped
     * or restarting as long as training would have (--coordinator-grace):
     * a rank gone before its Leave is read is a lost rank, and a job that
     * finished while the coordinator was stopped 30 s was recorded failed
     * (it waited 2 s). A process told to terminate waits LEAVE_MIN_MS
     * only: its scheduler kills it soon, and stops the coordinator too
     * (scancel signals every process of the job). */
    bool terminating = e->cfg.term_flag && *e->cfg.term_flag;
    uint64_t wait_ms = !terminating && e->cfg.coordinator_grace_ms > LEAVE_MIN_MS
                           ? e->cfg.coordinator_grace_ms
                           : LEAVE_MIN_MS;
    int err =
        gs_client_leave(e->client, gs__membership_generation(&e->member),
                        gs__membership_rank(&e->member), finished, reason ? reason : "", wait_ms);

    if (err)
      gs_log(e->cfg.log, GS_LOG_WARN, e->cfg.coord.job, gs__membership_rank(&e->member),
             "leave failed: %s", gs_client_error(e->client));
    e->member.joined = false;
  }
  gs_heartbeat_stop(e->hb);
  e->hb = NULL;
  gs_comm_destroy(e->comm);
  e->comm = NULL;
}

void gs_engine_free(gs_engine_t *e)
{
  if (!e)
    return;
  gs__ckpt_writer_stop(&e->ckpt_writer);
  gs_heartbeat_stop(e->hb);
  gs__engine_comm_stop(e, true);
  gs_comm_destroy(e->comm);
  gs_client_free(e->client);
  gs_join_result_free(&e->member.join);
  gs__engine_full_state_close(e);
  gs_packs_free(&e->packs);
  gs_pb_array_free(&e->member.settings);
  gs__trace_free(e);
  free(e->ready);
  free(e->ticket);
  if (e->cfg.dev) {
    for (int k = 0; k < 2; k++) {
      gs_device_host_free(e->cfg.dev, e->ctl_up[k]);
      gs_device_host_free(e->cfg.dev, e->flight[k].ctl);
      gs_device_host_free(e->cfg.dev, e->flight[k].fetched);
    }
    gs_device_free(e->cfg.dev, e->aux_dev);
    /* sharded: the control vector's own buffer, holding skip_dev */
    gs_device_free(e->cfg.dev, gs__engine_sharded(e) ? e->ctl_dev : e->skip_dev);
    gs_device_host_free(e->cfg.dev, e->drive.fetched);
  }
  if (e->owns_dev)
    gs_device_destroy(e->cfg.dev);
  gs__comm_thread_free(&e->ct);
  gs_client_tls_free(e->tls); /* after every client that used it */
  free_strings(e);
  free(e->layout_desc);
  free(e->resumed_extra);
  gs__engine_groups_free(e);
  free(e);
}
