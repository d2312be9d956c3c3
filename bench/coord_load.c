/* coord_load: a load generator for gradsync-coordinator. It simulates many
 * agents from one libuv loop, speaking the real wire protocol through
 * common/ (frames, Envelope, Batch, nanopb), and measures the two things a
 * coordinator must do at scale:
 *
 *   1. rendezvous: from the first connect to every simulated rank holding
 *      its Join answer (rank, generation); ranks are checked to be unique
 *      and the ring neighbours to be right;
 *   2. heartbeats: every rank heartbeats once per interval, spread evenly
 *      over the interval, for a while; the coordinator's CPU time is read
 *      from /proc/PID/stat (utime + stime) over that window, and its
 *      resident memory (VmRSS) before the first connect and when the window
 *      closes.
 *
 * Two modes. Direct (the default): one TCP connection per rank, each call a
 * frame of its own (slot 0). Node (--node-agents): one connection per node
 * of --ranks-per-node ranks, as a node agent holds it; a rank's calls carry
 * its slot (local rank + 1): the node's Joins and its Leaves go in one Batch,
 * its heartbeats of one interval in one NodeHeartbeat (the nodes' spread
 * evenly over the interval), which the coordinator answers only with news
 * (a rank's first beat, a changed directive).
 *
 * It prints a "joined" line when the rendezvous completes (so a script can
 * start another load, e.g. wrk, at that point) and one "result" line of
 * key=value pairs at the end; progress and errors go to stderr. */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "buf.h"
#include "frame.h"
#include "node_beats.h"
#include "parse.h"
#include "pb_array.h"
#include "tls_session.h"
#include "wire.h"

#define READ_CHUNK (64 * 1024)
#define FD_HEADROOM 64      /* descriptors beyond one per connection: loop, stdio, ... */
#define TICK_MS 1           /* heartbeat scheduler period */
#define MAX_PEERS_ALL 65536 /* decode bound of a PEERS_ALL reply */
#define MAX_SLOT 255        /* Envelope.slot of a node agent's rank: 1..255 */

enum phase { PH_JOIN, PH_HEARTBEAT, PH_LEAVE, PH_DONE };

typedef struct cfg {
  char host[256];
  uint16_t port;
  char job[128];
  char token[256];
  uint32_t ranks;
  uint32_t per_node;
  bool node_agents; /* one connection per node, its calls in Batches */
  uint32_t window;  /* connects in flight at once */
  uint64_t duration_ms, warmup_ms, interval_ms, join_timeout_ms;
  /* A hang to name: this long into heartbeating, rank hang_rank's data
   * loader hangs and every other rank waits in the allreduce. 0: none. */
  uint64_t hang_after_ms;
  uint32_t hang_rank;
  long coord_pid;  /* 0: no CPU measurement */
  bool reregister; /* survive a coordinator restart */
  gradsync_PeerSet peers;
  const char *tls_ca; /* speak TLS, verifying the coordinator with this CA */
} cfg_t;

/* A process's CPU time, from /proc: user and system seconds (utime and
 * stime of /proc/PID/stat) and how often it went to sleep and was woken
 * (voluntary_ctxt_switches of /proc/PID/status). */
typedef struct proc_cpu {
  double user_s, sys_s;
  unsigned long long wakeups;
} proc_cpu_t;

typedef struct load load_t;

/* One simulated rank. */
typedef struct sim_rank {
  uint32_t index;   /* which simulated rank: node index/per_node, local index%per_node */
  uint32_t rank;    /* from the Join reply */
  char session[48]; /* from the Join reply: sent with every later call */
  uint64_t hb_sent_ns;
  uint32_t hb_outstanding;
  uint64_t step;
  uint64_t news; /* node mode: the news of the last reply for its slot */
  bool joined, left;
  bool rejoining; /* its connection was lost: no heartbeats until re-registered */
} sim_rank_t;

/* One TCP connection: a rank's own (direct mode) or a node agent's for the
 * ranks of one node (node mode), ranks[first .. first + count). */
typedef struct conn {
  uv_tcp_t tcp;
  uv_connect_t connect;
  load_t *ld;
  uint32_t index;        /* which connection */
  uint32_t first, count; /* its ranks */
  uint32_t left;         /* of those, how many have their Leave answer */
  uint64_t batch_seq;    /* request id of its last Batch */
  gs_buf_t rbuf;         /* bytes of a frame not yet complete */
  bool connected, closed;
  bool lost;           /* --reregister: redialled once its handle closed */
  uint32_t backoff_ms; /* before its next redial */
  uint64_t redial_at_ns;
  gs_tls_t *tls; /* --tls-ca: its session, until its handle closed */
} conn_t;

struct load {
  cfg_t cfg;
  uv_loop_t *loop;
  uint32_t nconns, per_conn; /* connections, and ranks on each but maybe the last */
  conn_t *conns;
  sim_rank_t *ranks;
  uint8_t *rank_seen;
  uint32_t next_connect, connects_in_flight, connected, joined, left, closed;
  /* Encoding scratch, reused so a heartbeat costs no allocation: a
   * request's body, the entries of the Batch being built (for one
   * connection at a time: each is built and flushed in one callback), and
   * the frame being sent. */
  gs_buf_t body, batch, out;
  gs_node_beats_t *node_beats; /* node mode: the NodeHeartbeat being built */
  enum phase phase;
  uint64_t generation;
  uint64_t t_start_ns, t_connected_ns, t_joined_ns;
  uv_timer_t tick, deadline;
  uv_signal_t sigint, sigterm;
  /* Heartbeat schedule and counters. */
  uint64_t hb_start_ns, hb_sent, hb_replies, hb_aborts, hb_errors, hb_overlaps;
  uint64_t hb_rounds; /* connections' heartbeat rounds sent: the schedule's position */
  uint64_t hang_ns;   /* --hang-after: when the hang begins (uv_hrtime; 0: none) */
  uint64_t hang_step; /* the step every rank hangs at (0: not yet) */
  bool hang_told;
  /* --reregister: connections waiting to be redialled (a ring of indices,
   * in the order they closed), ranks not re-registered yet, and when the
   * first connection of the current loss went. */
  uint32_t *redial_q;
  uint32_t redial_head, redial_len;
  uint32_t rejoin_needed;
  uint64_t t_lost_ns, restarts;
  double last_rejoin_s;
  struct sockaddr_storage addr; /* the coordinator's */
  uint32_t *lat_us;             /* one per reply, for percentiles */
  size_t lat_count, lat_cap;
  /* The CPU window. */
  bool window_open, window_closed;
  uint64_t win_start_ns, win_end_ns, win_hb_replies0, win_hb_replies1, win_hb_sent0, win_hb_sent1;
  proc_cpu_t coord0, coord1;
  bool coord_ok;
  long coord_rss0_kb, coord_rss1_kb; /* before the first connect, at the window's end; -1 */
  double self_cpu0, self_cpu1;
  int errors; /* fatal problems seen; the exit status is 1 when > 0 */
  char rbuf[READ_CHUNK];
  struct ssl_ctx_st *tls;    /* --tls-ca */
  uint8_t plain[READ_CHUNK]; /* what a session decrypted */
};

static void usage(FILE *out)
{
  fprintf(out,
          "usage: coord_load --coordinator HOST:PORT [options]\n"
          "\n"
          "Simulates many gradsync agents against a running coordinator, one TCP connection\n"
          "each (or one per node with --node-agents), from one libuv loop: rendezvous them\n"
          "in one job, then heartbeat.\n"
          "\n"
          "  --coordinator HOST:PORT  the coordinator's RPC address (required)\n"
          "  --ranks N                simulated ranks (default 10000)\n"
          "  --ranks-per-node K       ranks per simulated node (default 8)\n"
          "  --node-agents            one connection per node, as its node agent holds it:\n"
          "                           each rank's calls on its slot (local rank + 1), a\n"
          "                           node's Joins and Leaves each in one Batch, its\n"
          "                           heartbeats of one interval in one NodeHeartbeat\n"
          "                           (K at most 255)\n"
          "  --job NAME               job name (default load)\n"
          "  --token TOKEN            shared secret (default $GRADSYNC_TOKEN)\n"
          "  --peers ring|all|none    peers asked for in Join (default ring, like the agent)\n"
          "  --connect-window W       connects in flight at once (default 1000)\n"
          "  --join-timeout DUR       give up when the rendezvous takes longer (default 60s)\n"
          "  --interval DUR           heartbeat period of each rank (default 1s); node\n"
          "                           mode sends one NodeHeartbeat per node per period\n"
          "  --warmup DUR             heartbeating before the CPU window opens (default 2s)\n"
          "  --duration DUR           length of the CPU window (default 15s); 0s: heartbeat\n"
          "                           until SIGINT or SIGTERM\n"
          "  --hang-after DUR         this long into heartbeating, one rank's data loader\n"
          "                           hangs (its heartbeats say so) and every other rank\n"
          "                           waits in the allreduce: a hang for the coordinator\n"
          "                           to name; prints the hang line below (default: none)\n"
          "  --hang-rank R            the rank that hangs (default: the middle one)\n"
          "  --coord-pid PID          measure this process's CPU time (/proc/PID/stat) and\n"
          "                           resident memory (VmRSS of /proc/PID/status)\n"
          "  --reregister             survive a coordinator restart as agents do: a\n"
          "                           connection lost while heartbeating is redialled\n"
          "                           (backoff 50 ms doubling to 1 s) and its ranks\n"
          "                           re-register (Join with rejoin_generation, their\n"
          "                           sessions) before they heartbeat again; prints the\n"
          "                           reregistered line below\n"
          "  --tls-ca FILE            speak TLS to the coordinator (one started with\n"
          "                           --tls-cert), verifying it with this CA\n"
          "  -h, --help               print this help and exit\n"
          "\n"
          "Output (stdout), one line each:\n"
          "  coord_load: joined ranks=N rendezvous_s=S generation=G\n"
          "  coord_load: hang rank=R at_unix_ms=T      (with --hang-after)\n"
          "  coord_load: lost the coordinator at_unix_ms=T   (with --reregister)\n"
          "  coord_load: reregistered ranks=N after_s=S at_unix_ms=T  (S: from the first\n"
          "              connection lost to the last rank's re-registration answered)\n"
          "  coord_load: result ranks=N mode=direct|node connections=C rendezvous_s=S\n"
          "              hb_per_s=R coord_cpu_pct=P ... coord_rss_mb=M coord_rss_per_rank_kb=K\n"
          "              ... errors=E\n"
          "hb_per_s counts ranks' heartbeats in either mode (node mode: those sent, as\n"
          "the coordinator answers them only with news). coord_rss_mb is the\n"
          "coordinator's VmRSS when the CPU window closes; coord_rss_per_rank_kb is that\n"
          "less its VmRSS before the first connect, over N (both -1 without --coord-pid).\n"
          "Exit status: 0 when every rank joined, heartbeated without an error and left;\n"
          "1 on a protocol or measurement failure; 2 on bad flags or limits.\n");
}

static double now_s(uint64_t ns)
{
  return ns / 1e9;
}

/* Reads `pid`'s CPU times; -1 on failure. The command name (field 2 of
 * stat) may hold spaces, so parsing starts after its closing parenthesis. */
static int proc_cpu(long pid, proc_cpu_t *out)
{
  char path[64], line[1024], *p;
  unsigned long long ut, st;
  FILE *f;
  size_t n;

  snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
  f = fopen(path, "r");
  if (!f)
    return -1;
  n = fread(line, 1, sizeof(line) - 1, f);
  fclose(f);
  line[n] = '\0';
  p = strrchr(line, ')');
  /* After ")": state ppid pgrp session tty tpgid flags minflt cminflt
   * majflt cmajflt utime stime. */
  if (!p || sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
    return -1;
  out->user_s = (double)ut / (double)sysconf(_SC_CLK_TCK);
  out->sys_s = (double)st / (double)sysconf(_SC_CLK_TCK);
  out->wakeups = 0;
  snprintf(path, sizeof(path), "/proc/%ld/status", pid);
  f = fopen(path, "r");
  if (!f)
    return -1;
  while (fgets(line, sizeof(line), f))
    if (sscanf(line, "voluntary_ctxt_switches: %llu", &out->wakeups) == 1)
      break;
  fclose(f);
  return 0;
}

/* `pid`'s resident memory in KiB (VmRSS of /proc/PID/status); -1 when it
 * cannot be read. */
static long proc_rss_kb(long pid)
{
  char path[64], line[256];
  long kb = -1;
  FILE *f;

  snprintf(path, sizeof(path), "/proc/%ld/status", pid);
  f = fopen(path, "r");
  if (!f)
    return -1;
  while (fgets(line, sizeof(line), f))
    if (sscanf(line, "VmRSS: %ld", &kb) == 1)
      break;
  fclose(f);
  return kb;
}

static double self_cpu_s(void)
{
  struct rusage ru;

  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + ru.ru_stime.tv_sec +
         ru.ru_stime.tv_usec / 1e6;
}

static void fail(load_t *ld, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void finish(load_t *ld);
static void leave_done(load_t *ld);
static void on_deadline(uv_timer_t *t);

/* A fatal problem: say it, and stop the run. */
static void fail(load_t *ld, const char *fmt, ...)
{
  va_list ap;

  fprintf(stderr, "coord_load: ");
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  ld->errors++;
  finish(ld);
}

/* --- sending --- */

typedef struct write_req {
  uv_write_t req;
  size_t len;
  uint8_t data[];
} write_req_t;

static void on_write(uv_write_t *req, int status)
{
  conn_t *c = req->handle->data;

  if (status < 0 && status != UV_ECANCELED && !c->ld->errors)
    fail(c->ld, "write to the coordinator failed: %s", uv_strerror(status));
  free(req);
}

/* Writes `len` bytes on c's socket; tries a direct write first, so a
 * heartbeat usually costs no allocation, and copies only what is left. */
static int raw_write(conn_t *c, const uint8_t *data, size_t len)
{
  uv_buf_t b = uv_buf_init((char *)data, (unsigned)len);
  int n = uv_try_write((uv_stream_t *)&c->tcp, &b, 1);
  write_req_t *w;

  if (n == (int)len)
    return 0;
  if (n < 0 && n != UV_EAGAIN)
    return GS_EIO;
  if (n < 0)
    n = 0;
  w = malloc(sizeof(*w) + len - (size_t)n);
  if (!w)
    return GS_ENOMEM;
  w->len = len - (size_t)n;
  memcpy(w->data, data + n, w->len);
  b = uv_buf_init((char *)w->data, (unsigned)w->len);
  if (uv_write(&w->req, (uv_stream_t *)&c->tcp, &b, 1, on_write)) {
    free(w);
    return GS_EIO;
  }
  return 0;
}

/* Sends `len` bytes to the coordinator: through c's TLS session, if any. */
static int conn_write(conn_t *c, const uint8_t *data, size_t len)
{
  if (!c->tls)
    return raw_write(c, data, len);
  return gs_tls_output(c->tls, data, len) ? GS_EIO : 0;
}

static void request_envelope(const load_t *ld, gradsync_Envelope *env, gs_method_t m,
                             uint64_t request_id, uint32_t timeout_ms, const char *session)
{
  memset(env, 0, sizeof(*env));
  snprintf(env->method, sizeof(env->method), "%s", gs_method_path(m));
  env->request_id = request_id;
  env->timeout_ms = timeout_ms;
  snprintf(env->token, sizeof(env->token), "%s", ld->cfg.token);
  snprintf(env->session, sizeof(env->session), "%s", session);
}

/* One call of rank r on its connection c: in direct mode a frame of its own
 * (slot 0), sent now; in node mode an entry of c's Batch on the rank's slot
 * (local rank + 1), sent by flush(). */
static int send_call(conn_t *c, const sim_rank_t *r, gs_method_t m, const pb_msgdesc_t *fields,
                     const void *msg, uint64_t request_id, uint32_t timeout_ms)
{
  load_t *ld = c->ld;
  gradsync_Envelope env;
  int err;

  request_envelope(ld, &env, m, request_id, timeout_ms, r->session);
  if (!ld->cfg.node_agents) {
    ld->out.len = 0;
    err = gs_wire_encode_frame(&ld->out, &env, fields, msg, SIZE_MAX);
    return err ? err : conn_write(c, ld->out.data, ld->out.len);
  }
  env.slot = r->index % ld->cfg.per_node + 1;
  ld->body.len = 0;
  err = gs_wire_encode(&ld->body, fields, msg);
  if (!err)
    err = gs_wire_encode_batch_entry(&ld->batch, &env, ld->body.data, ld->body.len, SIZE_MAX);
  return err;
}

/* Sends the Batch (or NodeHeartbeat, `m`) built for c, if any (node
 * mode): the connection's own call (slot 0) with a request id of its own. */
static int flush(conn_t *c, gs_method_t m)
{
  load_t *ld = c->ld;
  gradsync_Envelope env;
  int err;

  bool beats = m == GS_METHOD_NODE_HEARTBEAT;

  if (beats ? ld->node_beats->count == 0 : ld->batch.len == 0)
    return 0;
  if (c->closed) { /* a failure while building it closed every connection */
    ld->batch.len = 0;
    ld->node_beats->count = 0;
    return 0;
  }
  request_envelope(ld, &env, m, ++c->batch_seq, 0, "");
  ld->out.len = 0;
  err = beats ? gs_node_beats_encode_frame(ld->node_beats, &ld->out, &env, SIZE_MAX)
              : gs_wire_encode_frame_bytes(&ld->out, &env, ld->batch.data, ld->batch.len, SIZE_MAX);
  ld->batch.len = 0;
  ld->node_beats->count = 0;
  return err ? err : conn_write(c, ld->out.data, ld->out.len);
}

/* The Join an agent of simulated rank r sends. */
static void fill_join(const load_t *ld, const sim_rank_t *r, gradsync_JoinRequest *req)
{
  *req = (gradsync_JoinRequest)gradsync_JoinRequest_init_zero;
  snprintf(req->job, sizeof(req->job), "%s", ld->cfg.job);
  req->world_size = ld->cfg.ranks;
  snprintf(req->node, sizeof(req->node), "node%05u", r->index / ld->cfg.per_node);
  req->local_rank = r->index % ld->cfg.per_node;
  snprintf(req->device, sizeof(req->device), "cpu");
  req->has_model_signature = true;
  req->model_signature = (gradsync_ModelSignature){6, 235146, 0x5eed5eedULL, 0xf10a7ULL};
  snprintf(req->comm_addr, sizeof(req->comm_addr), "10.%u.%u.%u:%u", (r->index >> 16) & 255,
           (r->index >> 8) & 255, r->index & 255, 29500 + req->local_rank);
  req->peers = ld->cfg.peers;
}

static void send_join(conn_t *c, sim_rank_t *r, uint64_t now)
{
  load_t *ld = c->ld;
  gradsync_JoinRequest req;

  (void)now;
  fill_join(ld, r, &req);
  if (send_call(c, r, GS_METHOD_JOIN, gradsync_JoinRequest_fields, &req, 1,
                (uint32_t)ld->cfg.join_timeout_ms))
    fail(ld, "cannot send Join for agent %u", r->index);
}

/* A rank's re-registration with a coordinator that restarted: its Join
 * naming the generation, rank and world it has, under its session. */
static void send_rejoin(conn_t *c, sim_rank_t *r, uint64_t now)
{
  load_t *ld = c->ld;
  gradsync_JoinRequest req;

  (void)now;
  fill_join(ld, r, &req);
  req.rejoin_generation = ld->generation;
  req.rejoin_rank = r->rank;
  req.rejoin_world_size = ld->cfg.ranks;
  if (send_call(c, r, GS_METHOD_JOIN, gradsync_JoinRequest_fields, &req, 1,
                (uint32_t)ld->cfg.join_timeout_ms))
    fail(ld, "cannot send the re-registration of rank %u", r->rank);
}

/* During the hang: the hung rank's step stops in its data loader, every
 * other rank's in the allreduce that waits for it, the same step and
 * collective for all (the steps are the ones the hang began at). */
static void hung_beat(load_t *ld, sim_rank_t *r, gradsync_HeartbeatRequest *req, uint64_t now)
{
  uint32_t waited_ms = (uint32_t)((now - ld->hang_ns) / 1000000);

  if (!ld->hang_step)
    ld->hang_step = r->step;
  r->step = ld->hang_step;
  req->step = ld->hang_step;
  req->progress.collectives_done = ld->hang_step;
  req->progress.phase_ms = waited_ms;
  req->progress.phase =
      r->rank == ld->cfg.hang_rank ? gradsync_Phase_PHASE_DATA : gradsync_Phase_PHASE_ALLREDUCE;
}

static void send_heartbeat(conn_t *c, sim_rank_t *r, uint64_t now)
{
  load_t *ld = c->ld;
  gradsync_HeartbeatRequest req = gradsync_HeartbeatRequest_init_zero;

  if (r->rejoining)
    return;
  snprintf(req.job, sizeof(req.job), "%s", ld->cfg.job);
  req.generation = ld->generation;
  req.rank = r->rank;
  req.step = ++r->step;
  req.loss = 2.0f / (float)(1 + r->step);
  req.samples_per_sec = 1000.0f;
  req.compute_ms = 10.0f + 0.1f * (float)(r->rank % 5); /* no stragglers */
  req.comm_wait_ms = 1.0f;
  req.has_progress = true;
  req.progress = (gradsync_Progress){
      .phase = gradsync_Phase_PHASE_COMPUTE, .phase_ms = 5, .collectives_done = r->step};
  if (ld->hang_ns && now >= ld->hang_ns)
    hung_beat(ld, r, &req, now);
  ld->hb_sent++;
  if (ld->cfg.node_agents) {
    /* A beat of the node's NodeHeartbeat: the session until a reply came. */
    if (!ld->node_beats->count)
      gs_node_beats_reset(ld->node_beats, ld->cfg.job);
    if (gs_node_beats_add(ld->node_beats, r->index % ld->cfg.per_node + 1, &req, r->news,
                          r->news ? "" : r->session))
      fail(ld, "cannot add the beat of rank %u", r->rank);
    return;
  }
  if (r->hb_outstanding)
    ld->hb_overlaps++;
  r->hb_sent_ns = now;
  r->hb_outstanding++;
  if (send_call(c, r, GS_METHOD_HEARTBEAT, gradsync_HeartbeatRequest_fields, &req, 2 + r->step, 0))
    fail(ld, "cannot send a heartbeat for rank %u", r->rank);
}

static void send_leave(conn_t *c, sim_rank_t *r, uint64_t now)
{
  load_t *ld = c->ld;
  gradsync_LeaveRequest req = gradsync_LeaveRequest_init_zero;

  (void)now;
  snprintf(req.job, sizeof(req.job), "%s", ld->cfg.job);
  req.generation = ld->generation;
  req.rank = r->rank;
  req.finished = true;
  if (send_call(c, r, GS_METHOD_LEAVE, gradsync_LeaveRequest_fields, &req, 1ULL << 62, 0))
    fail(ld, "cannot send Leave for rank %u", r->rank);
}

typedef void (*send_fn)(conn_t *c, sim_rank_t *r, uint64_t now);

/* Makes one call per rank of c and sends them: a frame each in direct
 * mode, one Batch in node mode. */
static void send_all(conn_t *c, send_fn send, uint64_t now)
{
  load_t *ld = c->ld;

  for (uint32_t i = 0; i < c->count && !c->closed; i++)
    send(c, &ld->ranks[c->first + i], now);
  if (flush(c, send == send_heartbeat ? GS_METHOD_NODE_HEARTBEAT : GS_METHOD_BATCH))
    fail(ld, "cannot send a Batch on connection %u", c->index);
}

/* --- replies --- */

static void all_joined(load_t *ld);
static void rejoined(load_t *ld, sim_rank_t *r);

static void on_join_reply(load_t *ld, sim_rank_t *r, const gradsync_Envelope *env,
                          const gs_buf_t *body)
{
  gradsync_JoinResponse resp = gradsync_JoinResponse_init_zero;
  gs_pb_array_t peers;
  const gradsync_Peer *p;
  uint32_t n = ld->cfg.ranks;
  char why[128];

  if (env->status) {
    fail(ld, "%s of agent %u failed: status %d: %s", r->rejoining ? "Re-registration" : "Join",
         r->index, env->status, env->message);
    return;
  }
  gs_pb_array_init(&peers, gradsync_Peer_fields, sizeof(gradsync_Peer), MAX_PEERS_ALL);
  gs_pb_array_bind_decode(&resp.peers, &peers);
  if (gs_wire_decode(body->data, body->len, gradsync_JoinResponse_fields, &resp, why,
                     sizeof(why))) {
    gs_pb_array_free(&peers);
    fail(ld, "undecodable JoinResponse: %s", why);
    return;
  }
  p = peers.items;
  if (r->rejoining) {
    if (resp.rank != r->rank || resp.world_size != n || resp.generation != ld->generation)
      fail(ld, "bad re-registration answer for rank %u: rank %u, world %u, generation %llu",
           r->rank, resp.rank, resp.world_size, (unsigned long long)resp.generation);
    else
      rejoined(ld, r);
  } else if (resp.world_size != n || resp.rank >= n || ld->rank_seen[resp.rank] ||
             (ld->generation && resp.generation != ld->generation)) {
    fail(ld, "bad Join answer for agent %u: rank %u, world %u, generation %llu", r->index,
         resp.rank, resp.world_size, (unsigned long long)resp.generation);
  } else if (ld->cfg.peers == gradsync_PeerSet_PEERS_RING &&
             (peers.count != (n > 1 ? 2u : 1u) || p[0].rank != (resp.rank + n - 1) % n ||
              p[peers.count - 1].rank != (resp.rank + 1) % n)) {
    fail(ld, "rank %u got wrong ring neighbours", resp.rank);
  } else if (ld->cfg.peers == gradsync_PeerSet_PEERS_ALL && peers.count != n) {
    fail(ld, "rank %u got %zu peers, not %u", resp.rank, peers.count, n);
  } else {
    ld->rank_seen[resp.rank] = 1;
    snprintf(r->session, sizeof(r->session), "%s", resp.session);
    ld->generation = resp.generation;
    r->rank = resp.rank;
    r->joined = true;
    if (++ld->joined == n)
      all_joined(ld);
  }
  gs_pb_array_free(&peers);
}

/* Counts a heartbeat reply, decoded into `resp`: its error or its abort
 * (the first of each logged). False on an error. */
static bool count_heartbeat_reply(load_t *ld, const sim_rank_t *r, const gradsync_Envelope *env,
                                  const gs_buf_t *body, gradsync_HeartbeatResponse *resp)
{
  ld->hb_replies++;
  if (env->status ||
      gs_wire_decode(body->data, body->len, gradsync_HeartbeatResponse_fields, resp, NULL, 0)) {
    if (ld->hb_errors++ == 0)
      fprintf(stderr, "coord_load: rank %u: heartbeat failed: status %d: %s\n", r->rank,
              env->status, env->message);
    return false;
  }
  if (resp->abort && ld->hb_aborts++ == 0)
    fprintf(stderr, "coord_load: rank %u: generation aborted: %s\n", r->rank, resp->abort_reason);
  return true;
}

static void on_heartbeat_reply(load_t *ld, sim_rank_t *r, const gradsync_Envelope *env,
                               const gs_buf_t *body)
{
  gradsync_HeartbeatResponse resp = gradsync_HeartbeatResponse_init_zero;
  uint64_t now = uv_hrtime();

  if (r->hb_outstanding == 0) {
    fail(ld, "rank %u: a heartbeat reply nobody asked for", r->rank);
    return;
  }
  r->hb_outstanding--;
  if (!count_heartbeat_reply(ld, r, env, body, &resp) || resp.abort)
    return;
  if (r->hb_outstanding == 0 && ld->lat_count < ld->lat_cap)
    ld->lat_us[ld->lat_count++] = (uint32_t)((now - r->hb_sent_ns) / 1000);
}

static void conn_close(conn_t *c);

/* A rank's Leave answer; its connection closes with its last rank's. */
static void on_leave_reply(conn_t *c, sim_rank_t *r, const gradsync_Envelope *env)
{
  load_t *ld = c->ld;

  if (env->status)
    fail(ld, "Leave of rank %u failed: status %d: %s", r->rank, env->status, env->message);
  r->left = true;
  if (++c->left == c->count)
    conn_close(c);
  if (++ld->left == ld->cfg.ranks)
    leave_done(ld);
}

/* The reply to one call of rank r: a frame of its own, or an entry of a
 * Batch reply. */
static void on_reply(conn_t *c, sim_rank_t *r, const gradsync_Envelope *env, const gs_buf_t *body)
{
  gs_method_t m;

  if (!gs_method_from_path(env->method, &m))
    m = GS_METHOD_COUNT;
  switch (m) {
  case GS_METHOD_JOIN:
    on_join_reply(c->ld, r, env, body);
    break;
  case GS_METHOD_HEARTBEAT:
    on_heartbeat_reply(c->ld, r, env, body);
    break;
  case GS_METHOD_LEAVE:
    on_leave_reply(c, r, env);
    break;
  default:
    fail(c->ld, "unexpected reply '%s' (status %d: %s)", env->method, env->status, env->message);
  }
}

/* News for a rank's slot (node mode): the reply its next beats show. */
static void on_node_news(load_t *ld, sim_rank_t *r, const gradsync_Envelope *env,
                         const gs_buf_t *body)
{
  gradsync_HeartbeatResponse resp = gradsync_HeartbeatResponse_init_zero;

  if (count_heartbeat_reply(ld, r, env, body, &resp))
    r->news = resp.news;
}

/* A node agent's Batch reply: one reply per call, each on its rank's slot. */
static void on_batch_reply(conn_t *c, const gradsync_Envelope *env, const gs_buf_t *body)
{
  load_t *ld = c->ld;
  gs_buf_t ibody = {0};
  const uint8_t *item;
  size_t off = 0, len;
  bool bad = false;
  char why[128];

  if (!strcmp(env->method, gs_method_path(GS_METHOD_HEARTBEAT)) && env->slot &&
      env->slot <= c->count) {
    on_node_news(ld, &ld->ranks[c->first + env->slot - 1], env, body);
    return;
  }
  if (strcmp(env->method, gs_method_path(GS_METHOD_BATCH)) != 0 || env->status || env->slot) {
    fail(ld, "connection %u: unexpected reply '%s' on slot %u (status %d: %s)", c->index,
         env->method, env->slot, env->status, env->message);
    return;
  }
  while (!c->closed && gs_wire_batch_next(body->data, body->len, &off, &item, &len, &bad)) {
    gradsync_Envelope e;

    if (gs_wire_decode_envelope(item, len, &e, &ibody, why, sizeof(why)))
      fail(ld, "connection %u: undecodable Envelope in a Batch reply: %s", c->index, why);
    else if (e.slot == 0 || e.slot > c->count)
      fail(ld, "connection %u: a Batch reply for slot %u of %u", c->index, e.slot, c->count);
    else
      on_reply(c, &ld->ranks[c->first + e.slot - 1], &e, &ibody);
  }
  if (bad)
    fail(ld, "connection %u: undecodable BatchResponse", c->index);
  gs_buf_free(&ibody);
}

/* One complete frame from the coordinator. */
static void on_frame(conn_t *c, const uint8_t *payload, size_t len)
{
  gradsync_Envelope env;
  gs_buf_t body = {0};
  char why[128];

  if (gs_wire_decode_envelope(payload, len, &env, &body, why, sizeof(why)))
    fail(c->ld, "undecodable Envelope from the coordinator: %s", why);
  else if (c->ld->cfg.node_agents)
    on_batch_reply(c, &env, &body);
  else if (env.slot)
    fail(c->ld, "a reply on slot %u of a direct connection", env.slot);
  else
    on_reply(c, &c->ld->ranks[c->first], &env, &body);
  gs_buf_free(&body);
}

/* Cuts frames out of data[0..len); returns the bytes used, < 0 on error. A
 * Batch reply holds a reply per rank of the connection, each up to a frame. */
static long cut_frames(conn_t *c, const uint8_t *data, size_t len)
{
  size_t off = 0, max = (size_t)GS_FRAME_DEFAULT_MAX * c->count;

  while (!c->closed) {
    const uint8_t *payload;
    size_t plen;
    long used = gs_frame_parse(data + off, len - off, max, &payload, &plen);

    if (used < 0)
      return used;
    if (used == 0)
      break;
    on_frame(c, payload, plen);
    off += (size_t)used;
  }
  return (long)off;
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
  conn_t *c = h->data;

  (void)suggested;
  *buf = uv_buf_init(c->ld->rbuf, sizeof(c->ld->rbuf));
}

static void conn_lost(conn_t *c);
static void connected(conn_t *c);

/* Bytes from the coordinator, in the clear: frames cut, only an
 * incomplete frame's bytes kept per connection. */
static void plain_in(conn_t *c, const uint8_t *data, size_t n)
{
  load_t *ld = c->ld;
  long used;

  if (c->rbuf.len == 0) {
    used = cut_frames(c, data, n);
    if (used >= 0 && (size_t)used < n && !c->closed &&
        gs_buf_append(&c->rbuf, data + used, n - (size_t)used))
      used = GS_ENOMEM;
  } else {
    used = gs_buf_append(&c->rbuf, data, n);
    if (used == 0) {
      used = cut_frames(c, c->rbuf.data, c->rbuf.len);
      if (used > 0)
        gs_buf_consume(&c->rbuf, (size_t)used);
    }
  }
  if (used < 0)
    fail(ld, "bad frame from the coordinator: %s", gs_strerror((int)used));
}

static bool tls_plain(void *ctx, const uint8_t *data, size_t len)
{
  conn_t *c = ctx;

  plain_in(c, data, len);
  return !c->closed && !c->ld->errors;
}

static bool tls_cipher(void *ctx, const uint8_t *data, size_t len, bool more)
{
  (void)more;
  return raw_write(ctx, data, len) == 0;
}

/* Ciphertext (none: the ClientHello) through c's session; the connection
 * goes on as a plain one's once the handshake is done. */
static void tls_in(conn_t *c, const uint8_t *data, size_t n)
{
  load_t *ld = c->ld;
  bool was = gs_tls_established(c->tls);

  if (gs_tls_input(c->tls, data, n, ld->plain, sizeof(ld->plain))) {
    fail(ld, "TLS on connection %u: %s", c->index, gs_tls_error(c->tls));
    return;
  }
  if (!was && gs_tls_established(c->tls))
    connected(c);
}

/* Reads land in one shared buffer. */
static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
  conn_t *c = s->data;
  load_t *ld = c->ld;

  if (nread < 0) {
    if (ld->cfg.reregister && ld->phase == PH_HEARTBEAT) {
      conn_lost(c);
      return;
    }
    if (c->left < c->count && ld->phase != PH_DONE)
      fail(ld, "coordinator closed connection %u (agents %u..%u): %s", c->index, c->first,
           c->first + c->count - 1, uv_strerror((int)nread));
    conn_close(c);
    return;
  }
  if (nread == 0)
    return;
  if (c->tls)
    tls_in(c, (const uint8_t *)buf->base, (size_t)nread);
  else
    plain_in(c, (const uint8_t *)buf->base, (size_t)nread);
}

/* --- connections --- */

static void on_closed(uv_handle_t *h)
{
  conn_t *c = h->data;
  load_t *ld = c->ld;

  gs_buf_free(&c->rbuf);
  gs_tls_free(c->tls);
  c->tls = NULL;
  ld->closed++;
  if (c->lost && ld->phase == PH_HEARTBEAT) { /* redialled after its backoff */
    c->redial_at_ns = uv_hrtime() + c->backoff_ms * 1000000ULL;
    ld->redial_q[(ld->redial_head + ld->redial_len++) % ld->nconns] = c->index;
  }
}

static void conn_close(conn_t *c)
{
  if (c->closed)
    return;
  c->closed = true;
  uv_close((uv_handle_t *)&c->tcp, on_closed);
}

static void start_connects(load_t *ld);

static void on_connect(uv_connect_t *req, int status)
{
  conn_t *c = req->handle->data;
  load_t *ld = c->ld;

  ld->connects_in_flight--;
  if (status < 0) {
    if (c->lost) /* not back yet: again after a longer wait */
      c->backoff_ms = c->backoff_ms >= 500 ? 1000 : c->backoff_ms * 2;
    conn_close(c);
    if (ld->phase == PH_JOIN)
      fail(ld, "connect to %s:%u failed for connection %u: %s%s", ld->cfg.host, ld->cfg.port,
           c->index, uv_strerror(status),
           status == UV_EMFILE ? " (raise RLIMIT_NOFILE: ulimit -n)" : "");
    return;
  }
  uv_tcp_nodelay(&c->tcp, 1);
  if (uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read)) {
    fail(ld, "cannot read from connection %u", c->index);
    return;
  }
  if (!ld->tls) {
    connected(c);
    return;
  }
  c->tls =
      gs_tls_connect_new(ld->tls, ld->cfg.host,
                         &(gs_tls_io_t){.ctx = c, .on_plain = tls_plain, .on_cipher = tls_cipher});
  if (!c->tls) {
    fail(ld, "out of memory starting TLS on connection %u", c->index);
    return;
  }
  tls_in(c, NULL, 0);
}

/* c is connected (and its TLS handshake done): its ranks join, or
 * re-register when it was redialled. */
static void connected(conn_t *c)
{
  load_t *ld = c->ld;

  if (c->lost) { /* redialled: its ranks re-register */
    c->lost = false;
    c->backoff_ms = 0;
    send_all(c, send_rejoin, 0);
    return;
  }
  c->connected = true;
  if (++ld->connected == ld->nconns)
    ld->t_connected_ns = uv_hrtime();
  send_all(c, send_join, 0);
  start_connects(ld);
}

/* Keeps up to `window` connects in flight until every connection has one. */
static void start_connects(load_t *ld)
{
  while (ld->phase == PH_JOIN && ld->next_connect < ld->nconns &&
         ld->connects_in_flight < ld->cfg.window) {
    conn_t *c = &ld->conns[ld->next_connect];
    int err;

    c->ld = ld;
    c->index = ld->next_connect++;
    c->first = c->index * ld->per_conn;
    c->count = ld->cfg.ranks - c->first < ld->per_conn ? ld->cfg.ranks - c->first : ld->per_conn;
    uv_tcp_init(ld->loop, &c->tcp);
    c->tcp.data = c;
    err = uv_tcp_connect(&c->connect, &c->tcp, (struct sockaddr *)&ld->addr, on_connect);
    if (err) {
      conn_close(c);
      fail(ld, "cannot connect connection %u: %s%s", c->index, uv_strerror(err),
           err == UV_EMFILE ? " (raise RLIMIT_NOFILE: ulimit -n)" : "");
      return;
    }
    ld->connects_in_flight++;
  }
}

/* --- surviving a coordinator restart (--reregister) --- */

/* "coord_load: WHAT at_unix_ms=T", T the wall clock now, flushed. */
static void print_wall(const char *what)
{
  struct timespec wall;

  clock_gettime(CLOCK_REALTIME, &wall);
  printf("coord_load: %s at_unix_ms=%lld\n", what,
         (long long)wall.tv_sec * 1000 + wall.tv_nsec / 1000000);
  fflush(stdout);
}

/* The coordinator went away under c: its ranks stop heartbeating until
 * they have re-registered on a new connection, dialled once c's handle has
 * closed (on_closed) and its backoff passed (redial_due). */
static void conn_lost(conn_t *c)
{
  load_t *ld = c->ld;

  if (!ld->t_lost_ns) {
    ld->t_lost_ns = uv_hrtime();
    ld->restarts++;
    print_wall("lost the coordinator");
  }
  for (uint32_t i = 0; i < c->count; i++) {
    sim_rank_t *r = &ld->ranks[c->first + i];

    ld->rejoin_needed += !r->rejoining;
    r->rejoining = true;
    r->hb_outstanding = 0; /* their replies died with the connection */
    r->news = 0;           /* a new coordinator numbers its news afresh */
  }
  c->lost = true;
  c->backoff_ms = 50;
  conn_close(c);
}

/* Dials the lost connections whose backoff has passed, within the connect
 * window. */
static void redial_due(load_t *ld, uint64_t now)
{
  while (ld->redial_len && ld->connects_in_flight < ld->cfg.window) {
    conn_t *c = &ld->conns[ld->redial_q[ld->redial_head]];
    int err;

    if (c->redial_at_ns > now)
      break; /* the ring is in the order they closed: the rest wait too */
    ld->redial_head = (ld->redial_head + 1) % ld->nconns;
    ld->redial_len--;
    uv_tcp_init(ld->loop, &c->tcp);
    c->tcp.data = c;
    c->closed = false;
    err = uv_tcp_connect(&c->connect, &c->tcp, (struct sockaddr *)&ld->addr, on_connect);
    if (err) {
      conn_close(c); /* requeued by on_closed */
      continue;
    }
    ld->connects_in_flight++;
  }
}

static void rejoined(load_t *ld, sim_rank_t *r)
{
  char line[96];

  r->rejoining = false;
  if (--ld->rejoin_needed)
    return;
  ld->last_rejoin_s = now_s(uv_hrtime() - ld->t_lost_ns);
  ld->t_lost_ns = 0;
  snprintf(line, sizeof(line), "reregistered ranks=%u after_s=%.3f", ld->cfg.ranks,
           ld->last_rejoin_s);
  print_wall(line);
}

/* --- phases --- */

static int cmp_u32(const void *x, const void *y)
{
  uint32_t a = *(const uint32_t *)x, b = *(const uint32_t *)y;
  return (a > b) - (a < b);
}

static void close_window(load_t *ld)
{
  if (!ld->window_open || ld->window_closed)
    return;
  ld->window_closed = true;
  ld->win_end_ns = uv_hrtime();
  ld->win_hb_replies1 = ld->hb_replies;
  ld->win_hb_sent1 = ld->hb_sent;
  ld->self_cpu1 = self_cpu_s();
  if (ld->cfg.coord_pid && proc_cpu(ld->cfg.coord_pid, &ld->coord1) == 0)
    ld->coord_ok = true;
  if (ld->cfg.coord_pid)
    ld->coord_rss1_kb = proc_rss_kb(ld->cfg.coord_pid);
}

static void close_handles(load_t *ld)
{
  uv_close((uv_handle_t *)&ld->tick, NULL);
  uv_close((uv_handle_t *)&ld->deadline, NULL);
  uv_close((uv_handle_t *)&ld->sigint, NULL);
  uv_close((uv_handle_t *)&ld->sigterm, NULL);
}

/* Stops heartbeating. After a clean run every rank leaves (the Leave
 * replies end the run); after an error every connection is closed. */
static void finish(load_t *ld)
{
  if (ld->phase == PH_LEAVE || ld->phase == PH_DONE)
    return;
  close_window(ld);
  uv_timer_stop(&ld->tick);
  if (ld->rejoin_needed) {
    fprintf(stderr, "coord_load: %u ranks had not re-registered when the run ended\n",
            ld->rejoin_needed);
    ld->errors++;
  }
  if (ld->errors || ld->phase == PH_JOIN) {
    ld->phase = PH_DONE;
    for (uint32_t i = 0; i < ld->next_connect; i++)
      conn_close(&ld->conns[i]);
    close_handles(ld);
    return;
  }
  ld->phase = PH_LEAVE;
  uv_timer_start(&ld->deadline, on_deadline, 30000, 0);
  for (uint32_t i = 0; i < ld->nconns && ld->phase == PH_LEAVE; i++)
    send_all(&ld->conns[i], send_leave, 0);
}

/* The Leave phase ended (every reply in, or its deadline). */
static void leave_done(load_t *ld)
{
  if (ld->phase != PH_LEAVE)
    return;
  if (ld->left < ld->cfg.ranks) {
    fprintf(stderr, "coord_load: only %u of %u ranks got their Leave answer\n", ld->left,
            ld->cfg.ranks);
    ld->errors++;
  }
  ld->phase = PH_DONE;
  for (uint32_t i = 0; i < ld->nconns; i++)
    conn_close(&ld->conns[i]);
  close_handles(ld);
}

/* Sends the heartbeats due by now: connection i's round of the interval
 * (its rank's heartbeat, or its node's Batch of them) is due at start + i *
 * interval / C, so the load is smooth rather than a burst. */
static void on_tick(uv_timer_t *t)
{
  load_t *ld = t->data;
  uint64_t now = uv_hrtime(), elapsed = now - ld->hb_start_ns;
  uint64_t interval_ns = ld->cfg.interval_ms * 1000000ULL;
  uint64_t due =
      elapsed / interval_ns * ld->nconns + (elapsed % interval_ns) * ld->nconns / interval_ns;
  uint64_t warm_ns = ld->cfg.warmup_ms * 1000000ULL;

  if (ld->hang_ns && now >= ld->hang_ns && !ld->hang_told) {
    char line[48];

    /* The wall clock, for whoever polls the coordinator for its verdict. */
    snprintf(line, sizeof(line), "hang rank=%u", ld->cfg.hang_rank);
    print_wall(line);
    ld->hang_told = true;
  }
  redial_due(ld, now);
  while (ld->hb_rounds < due && ld->phase == PH_HEARTBEAT)
    send_all(&ld->conns[ld->hb_rounds++ % ld->nconns], send_heartbeat, now);
  if (!ld->window_open && elapsed >= warm_ns) {
    ld->window_open = true;
    ld->win_start_ns = now;
    ld->win_hb_replies0 = ld->hb_replies;
    ld->win_hb_sent0 = ld->hb_sent;
    ld->self_cpu0 = self_cpu_s();
    if (ld->cfg.coord_pid && proc_cpu(ld->cfg.coord_pid, &ld->coord0)) {
      fail(ld, "cannot read /proc/%ld/stat: %s", ld->cfg.coord_pid, strerror(errno));
      return;
    }
    fprintf(stderr, "coord_load: CPU window open (%u ranks heartbeating every %llu ms)\n",
            ld->cfg.ranks, (unsigned long long)ld->cfg.interval_ms);
  }
  if (ld->cfg.duration_ms && ld->window_open &&
      elapsed >= warm_ns + ld->cfg.duration_ms * 1000000ULL)
    finish(ld);
}

static void all_joined(load_t *ld)
{
  ld->t_joined_ns = uv_hrtime();
  uv_timer_stop(&ld->deadline);
  printf("coord_load: joined ranks=%u rendezvous_s=%.3f generation=%llu\n", ld->cfg.ranks,
         now_s(ld->t_joined_ns - ld->t_start_ns), (unsigned long long)ld->generation);
  fflush(stdout);
  ld->phase = PH_HEARTBEAT;
  ld->hb_start_ns = uv_hrtime();
  if (ld->cfg.hang_after_ms)
    ld->hang_ns = ld->hb_start_ns + ld->cfg.hang_after_ms * 1000000ULL;
  uv_timer_start(&ld->tick, on_tick, TICK_MS, TICK_MS);
}

static void on_deadline(uv_timer_t *t)
{
  load_t *ld = t->data;

  if (ld->phase == PH_JOIN)
    fail(ld, "rendezvous not complete after %llu ms: %u connected, %u joined of %u",
         (unsigned long long)ld->cfg.join_timeout_ms, ld->connected, ld->joined, ld->cfg.ranks);
  else
    leave_done(ld);
}

static void on_signal(uv_signal_t *h, int signum)
{
  load_t *ld = h->data;

  fprintf(stderr, "coord_load: %s: stopping\n", signum == SIGINT ? "SIGINT" : "SIGTERM");
  if (ld->phase == PH_JOIN)
    ld->errors++;
  finish(ld);
}

static void report(load_t *ld)
{
  double win = ld->window_closed ? now_s(ld->win_end_ns - ld->win_start_ns) : 0;
  double coord_pct = -1, user_pct = -1, sys_pct = -1, wakeups = -1, self_pct = -1, rate = 0;
  double rss_mb = -1, rss_per_rank_kb = -1;
  uint32_t p50 = 0, p99 = 0, pmax = 0;

  if (win > 0) {
    /* Node mode: beats are answered only with news, so those sent count
     * (the Leaves, answered after them on each connection, show every
     * one was read). */
    rate = ld->cfg.node_agents ? (ld->win_hb_sent1 - ld->win_hb_sent0) / win
                               : (ld->win_hb_replies1 - ld->win_hb_replies0) / win;
    self_pct = 100 * (ld->self_cpu1 - ld->self_cpu0) / win;
    if (ld->coord_ok) {
      user_pct = 100 * (ld->coord1.user_s - ld->coord0.user_s) / win;
      sys_pct = 100 * (ld->coord1.sys_s - ld->coord0.sys_s) / win;
      coord_pct = user_pct + sys_pct;
      wakeups = (double)(ld->coord1.wakeups - ld->coord0.wakeups) / win;
    }
  }
  if (ld->coord_rss1_kb >= 0) {
    rss_mb = ld->coord_rss1_kb / 1024.0;
    if (ld->coord_rss0_kb >= 0)
      rss_per_rank_kb = (double)(ld->coord_rss1_kb - ld->coord_rss0_kb) / ld->cfg.ranks;
  }
  if (ld->lat_count) {
    qsort(ld->lat_us, ld->lat_count, sizeof(uint32_t), cmp_u32);
    p50 = ld->lat_us[ld->lat_count / 2];
    p99 = ld->lat_us[ld->lat_count * 99 / 100];
    pmax = ld->lat_us[ld->lat_count - 1];
  }
  printf("coord_load: result ranks=%u mode=%s connections=%u connect_s=%.3f rendezvous_s=%.3f "
         "generation=%llu window_s=%.2f hb_sent=%llu hb_replies=%llu hb_per_s=%.0f "
         "hb_errors=%llu hb_aborts=%llu hb_overlaps=%llu hb_p50_ms=%.3f hb_p99_ms=%.3f "
         "hb_max_ms=%.3f coord_cpu_pct=%.2f coord_user_pct=%.2f coord_sys_pct=%.2f "
         "coord_wakeups_per_s=%.0f coord_rss_mb=%.1f coord_rss_per_rank_kb=%.2f "
         "load_cpu_pct=%.2f left=%u restarts=%llu reregister_s=%.3f tls=%d errors=%d\n",
         ld->cfg.ranks, ld->cfg.node_agents ? "node" : "direct", ld->nconns,
         ld->t_connected_ns ? now_s(ld->t_connected_ns - ld->t_start_ns) : -1,
         ld->t_joined_ns ? now_s(ld->t_joined_ns - ld->t_start_ns) : -1,
         (unsigned long long)ld->generation, win, (unsigned long long)ld->hb_sent,
         (unsigned long long)ld->hb_replies, rate, (unsigned long long)ld->hb_errors,
         (unsigned long long)ld->hb_aborts, (unsigned long long)ld->hb_overlaps, p50 / 1000.0,
         p99 / 1000.0, pmax / 1000.0, coord_pct, user_pct, sys_pct, wakeups, rss_mb,
         rss_per_rank_kb, self_pct, ld->left, (unsigned long long)ld->restarts,
         ld->restarts ? ld->last_rejoin_s : -1.0, ld->tls != NULL, ld->errors);
  fflush(stdout);
}

/* --- setup --- */

/* One descriptor per connection: raise the soft limit (and the hard one,
 * which root may) to what the run needs, or say why not. */
static int raise_fd_limit(uint32_t conns)
{
  rlim_t need = (rlim_t)conns + FD_HEADROOM;
  struct rlimit rl;

  if (getrlimit(RLIMIT_NOFILE, &rl)) {
    fprintf(stderr, "coord_load: getrlimit(RLIMIT_NOFILE): %s\n", strerror(errno));
    return 2;
  }
  if (rl.rlim_cur >= need)
    return 0;
  if (rl.rlim_max < need) {
    struct rlimit up = {need, need};

    if (setrlimit(RLIMIT_NOFILE, &up) == 0)
      return 0;
    fprintf(stderr,
            "coord_load: %u connections need %llu open files but the hard limit "
            "(RLIMIT_NOFILE) is %llu and cannot be raised (%s); use fewer --ranks or raise it "
            "(ulimit -Hn as root, LimitNOFILE= in systemd, or /etc/security/limits.conf)\n",
            conns, (unsigned long long)need, (unsigned long long)rl.rlim_max, strerror(errno));
    return 2;
  }
  rl.rlim_cur = need;
  if (setrlimit(RLIMIT_NOFILE, &rl)) {
    fprintf(stderr, "coord_load: cannot raise the open-file limit to %llu: %s\n",
            (unsigned long long)need, strerror(errno));
    return 2;
  }
  return 0;
}

enum {
  OPT_COORD = 256,
  OPT_RANKS,
  OPT_PER_NODE,
  OPT_JOB,
  OPT_TOKEN,
  OPT_PEERS,
  OPT_WINDOW,
  OPT_JOIN_TIMEOUT,
  OPT_INTERVAL,
  OPT_WARMUP,
  OPT_DURATION,
  OPT_PID,
  OPT_NODE_AGENTS,
  OPT_HANG_AFTER,
  OPT_HANG_RANK,
  OPT_REREGISTER,
  OPT_TLS_CA,
};

static const struct option options[] = {
    {"coordinator", required_argument, NULL, OPT_COORD},
    {"ranks", required_argument, NULL, OPT_RANKS},
    {"ranks-per-node", required_argument, NULL, OPT_PER_NODE},
    {"job", required_argument, NULL, OPT_JOB},
    {"token", required_argument, NULL, OPT_TOKEN},
    {"peers", required_argument, NULL, OPT_PEERS},
    {"connect-window", required_argument, NULL, OPT_WINDOW},
    {"join-timeout", required_argument, NULL, OPT_JOIN_TIMEOUT},
    {"interval", required_argument, NULL, OPT_INTERVAL},
    {"warmup", required_argument, NULL, OPT_WARMUP},
    {"duration", required_argument, NULL, OPT_DURATION},
    {"coord-pid", required_argument, NULL, OPT_PID},
    {"node-agents", no_argument, NULL, OPT_NODE_AGENTS},
    {"hang-after", required_argument, NULL, OPT_HANG_AFTER},
    {"hang-rank", required_argument, NULL, OPT_HANG_RANK},
    {"reregister", no_argument, NULL, OPT_REREGISTER},
    {"tls-ca", required_argument, NULL, OPT_TLS_CA},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

static int bad(const char *flag, const char *value, const char *expect)
{
  fprintf(stderr, "coord_load: invalid value '%s' for --%s: expected %s\n", value, flag, expect);
  return 2;
}

/* Parses argv into cfg; 0 to run, -1 to exit 0, else an exit status. */
static int parse_flags(int argc, char **argv, cfg_t *cfg)
{
  const char *env_token = getenv("GRADSYNC_TOKEN");
  bool have_coord = false;
  long n;
  int opt;

  *cfg = (cfg_t){.ranks = 10000,
                 .per_node = 8,
                 .window = 1000,
                 .duration_ms = 15000,
                 .warmup_ms = 2000,
                 .interval_ms = 1000,
                 .join_timeout_ms = 60000,
                 .hang_rank = UINT32_MAX,
                 .peers = gradsync_PeerSet_PEERS_RING};
  snprintf(cfg->job, sizeof(cfg->job), "load");
  if (env_token)
    snprintf(cfg->token, sizeof(cfg->token), "%s", env_token);
  while ((opt = getopt_long(argc, argv, "h", options, NULL)) != -1) {
    const char *name = opt >= OPT_COORD ? options[opt - OPT_COORD].name : "";

    switch (opt) {
    case OPT_COORD:
      if (gs_parse_addr(optarg, cfg->host, sizeof(cfg->host), &cfg->port) || cfg->port == 0)
        return bad(name, optarg, "HOST:PORT with a non-zero port");
      if (strcmp(cfg->host, "0.0.0.0") == 0)
        snprintf(cfg->host, sizeof(cfg->host), "127.0.0.1");
      have_coord = true;
      break;
    case OPT_RANKS:
    case OPT_PER_NODE:
    case OPT_WINDOW:
      if (gs_parse_long(optarg, 1, 1 << 20, &n))
        return bad(name, optarg, "an integer from 1 to 1048576");
      *(opt == OPT_RANKS      ? &cfg->ranks
        : opt == OPT_PER_NODE ? &cfg->per_node
                              : &cfg->window) = (uint32_t)n;
      break;
    case OPT_JOB:
    case OPT_TOKEN:
      if (strlen(optarg) >= (opt == OPT_JOB ? sizeof(cfg->job) : sizeof(cfg->token)))
        return bad(name, opt == OPT_JOB ? optarg : "(hidden)", "a shorter string");
      if (opt == OPT_JOB)
        snprintf(cfg->job, sizeof(cfg->job), "%s", optarg);
      else
        snprintf(cfg->token, sizeof(cfg->token), "%s", optarg);
      break;
    case OPT_PEERS:
      if (strcmp(optarg, "ring") == 0)
        cfg->peers = gradsync_PeerSet_PEERS_RING;
      else if (strcmp(optarg, "all") == 0)
        cfg->peers = gradsync_PeerSet_PEERS_ALL;
      else if (strcmp(optarg, "none") == 0)
        cfg->peers = gradsync_PeerSet_PEERS_NONE;
      else
        return bad(name, optarg, "ring, all or none");
      break;
    case OPT_JOIN_TIMEOUT:
    case OPT_INTERVAL:
    case OPT_WARMUP:
    case OPT_DURATION:
    case OPT_HANG_AFTER: {
      uint64_t ms;

      if (gs_parse_duration_ms(optarg, &ms) ||
          (ms == 0 && opt != OPT_DURATION && opt != OPT_WARMUP))
        return bad(name, optarg, "a duration such as 500ms, 2s or 1m");
      *(opt == OPT_JOIN_TIMEOUT ? &cfg->join_timeout_ms
        : opt == OPT_INTERVAL   ? &cfg->interval_ms
        : opt == OPT_WARMUP     ? &cfg->warmup_ms
        : opt == OPT_HANG_AFTER ? &cfg->hang_after_ms
                                : &cfg->duration_ms) = ms;
      break;
    }
    case OPT_HANG_RANK:
      if (gs_parse_long(optarg, 0, 1 << 20, &n))
        return bad(name, optarg, "a rank");
      cfg->hang_rank = (uint32_t)n;
      break;
    case OPT_PID:
      if (gs_parse_long(optarg, 1, 1L << 30, &n))
        return bad(name, optarg, "a process id");
      cfg->coord_pid = n;
      break;
    case OPT_NODE_AGENTS:
      cfg->node_agents = true;
      break;
    case OPT_REREGISTER:
      cfg->reregister = true;
      break;
    case OPT_TLS_CA:
      cfg->tls_ca = optarg;
      break;
    case 'h':
      usage(stdout);
      return -1;
    default:
      fprintf(stderr, "Try 'coord_load --help'.\n");
      return 2;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "coord_load: unexpected argument '%s'\n", argv[optind]);
    return 2;
  }
  if (!have_coord) {
    fprintf(stderr, "coord_load: --coordinator HOST:PORT is required (try --help)\n");
    return 2;
  }
  if (cfg->hang_rank == UINT32_MAX)
    cfg->hang_rank = cfg->ranks / 2;
  if (cfg->hang_rank >= cfg->ranks) {
    fprintf(stderr, "coord_load: --hang-rank %u is not one of the %u ranks\n", cfg->hang_rank,
            cfg->ranks);
    return 2;
  }
  if (cfg->node_agents && cfg->per_node > MAX_SLOT) {
    fprintf(stderr, "coord_load: --node-agents takes at most %u --ranks-per-node (slots 1..%u)\n",
            MAX_SLOT, MAX_SLOT);
    return 2;
  }
  if (cfg->ranks > 65536 && cfg->peers == gradsync_PeerSet_PEERS_ALL) {
    fprintf(stderr, "coord_load: --peers all is limited to 65536 ranks\n");
    return 2;
  }
  return 0;
}

static int load_init(load_t *ld, uv_loop_t *loop)
{
  uint64_t windows = ld->cfg.duration_ms ? ld->cfg.duration_ms + ld->cfg.warmup_ms : 600000;

  ld->loop = loop;
  ld->conns = calloc(ld->nconns, sizeof(*ld->conns));
  ld->ranks = calloc(ld->cfg.ranks, sizeof(*ld->ranks));
  ld->rank_seen = calloc(ld->cfg.ranks, 1);
  ld->node_beats = calloc(1, sizeof(*ld->node_beats));
  ld->redial_q = calloc(ld->nconns, sizeof(*ld->redial_q));
  /* Room for every reply of a timed run (10% slack); later ones go uncounted. */
  ld->lat_cap = (size_t)(ld->cfg.ranks * (windows / (double)ld->cfg.interval_ms) * 1.1) + 1024;
  ld->lat_us = malloc(ld->lat_cap * sizeof(*ld->lat_us));
  if (!ld->conns || !ld->ranks || !ld->rank_seen || !ld->node_beats || !ld->lat_us ||
      !ld->redial_q) {
    fprintf(stderr, "coord_load: out of memory for %u ranks\n", ld->cfg.ranks);
    return 1;
  }
  for (uint32_t i = 0; i < ld->cfg.ranks; i++)
    ld->ranks[i].index = i;
  ld->coord_rss0_kb = ld->coord_rss1_kb = -1;
  if (strchr(ld->cfg.host, ':'))
    uv_ip6_addr(ld->cfg.host, ld->cfg.port, (struct sockaddr_in6 *)&ld->addr);
  else
    uv_ip4_addr(ld->cfg.host, ld->cfg.port, (struct sockaddr_in *)&ld->addr);
  uv_timer_init(loop, &ld->tick);
  uv_timer_init(loop, &ld->deadline);
  uv_signal_init(loop, &ld->sigint);
  uv_signal_init(loop, &ld->sigterm);
  ld->tick.data = ld->deadline.data = ld->sigint.data = ld->sigterm.data = ld;
  uv_signal_start(&ld->sigint, on_signal, SIGINT);
  uv_signal_start(&ld->sigterm, on_signal, SIGTERM);
  return 0;
}

int main(int argc, char **argv)
{
  uv_loop_t loop;
  load_t *ld = calloc(1, sizeof(*ld));
  int rc;

  if (!ld) {
    fprintf(stderr, "coord_load: out of memory\n");
    return 1;
  }
  rc = parse_flags(argc, argv, &ld->cfg);
  ld->per_conn = ld->cfg.node_agents ? ld->cfg.per_node : 1;
  ld->nconns = (uint32_t)(((uint64_t)ld->cfg.ranks + ld->per_conn - 1) / ld->per_conn);
  if (rc == 0)
    rc = raise_fd_limit(ld->nconns);
  if (rc) {
    free(ld);
    return rc < 0 ? 0 : rc;
  }
  if (ld->cfg.tls_ca) {
    char why[256];

    ld->tls = gs_tls_client_ctx_new(ld->cfg.tls_ca, NULL, NULL, why, sizeof(why));
    if (!ld->tls) {
      fprintf(stderr, "coord_load: %s\n", why);
      free(ld);
      return 2;
    }
  }
  signal(SIGPIPE, SIG_IGN);
  uv_loop_init(&loop);
  rc = load_init(ld, &loop);
  if (rc == 0) {
    fprintf(stderr,
            "coord_load: %u ranks (%u per node) on %u connections joining job %s at %s:%u\n",
            ld->cfg.ranks, ld->cfg.per_node, ld->nconns, ld->cfg.job, ld->cfg.host, ld->cfg.port);
    if (ld->cfg.coord_pid)
      ld->coord_rss0_kb = proc_rss_kb(ld->cfg.coord_pid);
    ld->t_start_ns = uv_hrtime();
    uv_timer_start(&ld->deadline, on_deadline, ld->cfg.join_timeout_ms, 0);
    start_connects(ld);
    uv_run(&loop, UV_RUN_DEFAULT);
    report(ld);
    rc = ld->errors || ld->hb_errors || ld->hb_aborts ? 1 : 0;
  }
  if (uv_loop_close(&loop)) {
    fprintf(stderr, "coord_load: handles left open at exit\n");
    rc = 1;
  }
  free(ld->conns);
  free(ld->ranks);
  free(ld->rank_seen);
  free(ld->node_beats);
  free(ld->redial_q);
  gs_buf_free(&ld->body);
  gs_buf_free(&ld->batch);
  gs_buf_free(&ld->out);
  free(ld->lat_us);
  gs_tls_client_ctx_free(ld->tls);
  free(ld);
  return rc;
}
