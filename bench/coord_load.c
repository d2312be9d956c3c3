/* coord_load: a load generator for gradsync-coordinator. It simulates many
 * agents from one libuv loop, each on its own TCP connection and speaking
 * the real wire protocol through common/ (frames, Envelope, nanopb), and
 * measures the two things a coordinator must do at scale:
 *
 *   1. rendezvous: from the first connect to every simulated rank holding
 *      its Join answer (rank, generation); ranks are checked to be unique
 *      and the ring neighbours to be right;
 *   2. heartbeats: every rank heartbeats once per interval, spread evenly
 *      over the interval, for a while; the coordinator's CPU time is read
 *      from /proc/PID/stat (utime + stime) over that window.
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
#include <unistd.h>
#include <uv.h>

#include "buf.h"
#include "frame.h"
#include "parse.h"
#include "pb_array.h"
#include "wire.h"

#define READ_CHUNK (64 * 1024)
#define FD_HEADROOM 64      /* descriptors beyond one per rank: loop, stdio, ... */
#define TICK_MS 1           /* heartbeat scheduler period */
#define MAX_PEERS_ALL 65536 /* decode bound of a PEERS_ALL reply */

enum phase { PH_JOIN, PH_HEARTBEAT, PH_LEAVE, PH_DONE };

typedef struct cfg {
  char host[256];
  uint16_t port;
  char job[128];
  char token[256];
  uint32_t ranks;
  uint32_t per_node;
  uint32_t window; /* connects in flight at once */
  uint64_t duration_ms, warmup_ms, interval_ms, join_timeout_ms;
  long coord_pid; /* 0: no CPU measurement */
  gradsync_PeerSet peers;
} cfg_t;

/* A process's CPU time, from /proc: user and system seconds (utime and
 * stime of /proc/PID/stat) and how often it went to sleep and was woken
 * (voluntary_ctxt_switches of /proc/PID/status). */
typedef struct proc_cpu {
  double user_s, sys_s;
  unsigned long long wakeups;
} proc_cpu_t;

typedef struct load load_t;

typedef struct agent {
  uv_tcp_t tcp;
  uv_connect_t connect;
  load_t *ld;
  uint32_t index;   /* which simulated agent: node index/per_node, local index%per_node */
  uint32_t rank;    /* from the Join reply */
  char session[48]; /* from the Join reply: sent with every later call */
  gs_buf_t rbuf;    /* bytes of a frame not yet complete */
  uint64_t hb_sent_ns;
  uint32_t hb_outstanding;
  uint64_t step;
  bool connected, joined, left, closed;
} agent_t;

struct load {
  cfg_t cfg;
  uv_loop_t *loop;
  agent_t *agents;
  uint8_t *rank_seen;
  uint32_t next_connect, connects_in_flight, connected, joined, left, closed;
  enum phase phase;
  uint64_t generation;
  uint64_t t_start_ns, t_connected_ns, t_joined_ns;
  uv_timer_t tick, deadline;
  uv_signal_t sigint, sigterm;
  /* Heartbeat schedule and counters. */
  uint64_t hb_start_ns, hb_sent, hb_replies, hb_aborts, hb_errors, hb_overlaps;
  uint32_t *lat_us; /* one per reply, for percentiles */
  size_t lat_count, lat_cap;
  /* The CPU window. */
  bool window_open, window_closed;
  uint64_t win_start_ns, win_end_ns, win_hb_replies0, win_hb_replies1;
  proc_cpu_t coord0, coord1;
  bool coord_ok;
  double self_cpu0, self_cpu1;
  int errors; /* fatal problems seen; the exit status is 1 when > 0 */
  char rbuf[READ_CHUNK];
};

static void usage(FILE *out)
{
  fprintf(out, "usage: coord_load --coordinator HOST:PORT [options]\n"
               "\n"
               "Simulates many gradsync agents against a running coordinator, one TCP connection\n"
               "each, from one libuv loop: rendezvous them in one job, then heartbeat.\n"
               "\n"
               "  --coordinator HOST:PORT  the coordinator's RPC address (required)\n"
               "  --ranks N                simulated ranks, one connection each (default 10000)\n"
               "  --ranks-per-node K       agents per simulated node (default 8)\n"
               "  --job NAME               job name (default load)\n"
               "  --token TOKEN            shared secret (default $GRADSYNC_TOKEN)\n"
               "  --peers ring|all|none    peers asked for in Join (default ring, like the agent)\n"
               "  --connect-window W       connects in flight at once (default 1000)\n"
               "  --join-timeout DUR       give up when the rendezvous takes longer (default 60s)\n"
               "  --interval DUR           heartbeat period of each rank (default 1s)\n"
               "  --warmup DUR             heartbeating before the CPU window opens (default 2s)\n"
               "  --duration DUR           length of the CPU window (default 15s); 0s: heartbeat\n"
               "                           until SIGINT or SIGTERM\n"
               "  --coord-pid PID          measure this process's CPU time (/proc/PID/stat)\n"
               "  -h, --help               print this help and exit\n"
               "\n"
               "Output (stdout), one line each:\n"
               "  coord_load: joined ranks=N rendezvous_s=S generation=G\n"
               "  coord_load: result ranks=N rendezvous_s=S hb_per_s=R coord_cpu_pct=P ...\n"
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
  agent_t *a = req->handle->data;

  if (status < 0 && status != UV_ECANCELED && !a->ld->errors)
    fail(a->ld, "write to the coordinator failed: %s", uv_strerror(status));
  free(req);
}

/* Sends one request; tries a direct write first, so a heartbeat usually
 * costs no allocation. */
static int send_request(agent_t *a, const char *method, const pb_msgdesc_t *fields, const void *msg,
                        uint64_t request_id, uint32_t timeout_ms)
{
  load_t *ld = a->ld;
  gradsync_Envelope env;
  uint8_t stack[1024];
  gs_buf_t out = {0};
  uv_buf_t b;
  write_req_t *w;
  int n, err;

  memset(&env, 0, sizeof(env));
  snprintf(env.method, sizeof(env.method), GS_METHOD_PREFIX "%s", method);
  env.request_id = request_id;
  env.timeout_ms = timeout_ms;
  snprintf(env.token, sizeof(env.token), "%s", ld->cfg.token);
  snprintf(env.session, sizeof(env.session), "%s", a->session);
  out.data = stack;
  out.cap = sizeof(stack);
  err = gs_wire_encode_frame(&out, &env, fields, msg, SIZE_MAX);
  if (err)
    goto out;
  b = uv_buf_init((char *)out.data, (unsigned)out.len);
  n = uv_try_write((uv_stream_t *)&a->tcp, &b, 1);
  if (n == (int)out.len)
    goto out;
  if (n < 0 && n != UV_EAGAIN) {
    err = GS_EIO;
    goto out;
  }
  if (n < 0)
    n = 0;
  w = malloc(sizeof(*w) + out.len - (size_t)n);
  if (!w) {
    err = GS_ENOMEM;
    goto out;
  }
  w->len = out.len - (size_t)n;
  memcpy(w->data, out.data + n, w->len);
  b = uv_buf_init((char *)w->data, (unsigned)w->len);
  if (uv_write(&w->req, (uv_stream_t *)&a->tcp, &b, 1, on_write)) {
    free(w);
    err = GS_EIO;
  }
out:
  if (out.data != stack)
    free(out.data); /* gs_buf_reserve moved a large frame to the heap */
  return err;
}

static void send_join(agent_t *a)
{
  load_t *ld = a->ld;
  gradsync_JoinRequest req = gradsync_JoinRequest_init_zero;

  snprintf(req.job, sizeof(req.job), "%s", ld->cfg.job);
  req.world_size = ld->cfg.ranks;
  snprintf(req.node, sizeof(req.node), "node%05u", a->index / ld->cfg.per_node);
  req.local_rank = a->index % ld->cfg.per_node;
  snprintf(req.device, sizeof(req.device), "cpu");
  req.has_model_signature = true;
  req.model_signature = (gradsync_ModelSignature){6, 235146, 0x5eed5eedULL, 0xf10a7ULL};
  snprintf(req.comm_addr, sizeof(req.comm_addr), "10.%u.%u.%u:%u", (a->index >> 16) & 255,
           (a->index >> 8) & 255, a->index & 255, 29500 + req.local_rank);
  req.peers = ld->cfg.peers;
  if (send_request(a, "Join", gradsync_JoinRequest_fields, &req, 1,
                   (uint32_t)ld->cfg.join_timeout_ms))
    fail(ld, "cannot send Join for agent %u", a->index);
}

static void send_heartbeat(agent_t *a, uint64_t now)
{
  load_t *ld = a->ld;
  gradsync_HeartbeatRequest req = gradsync_HeartbeatRequest_init_zero;

  snprintf(req.job, sizeof(req.job), "%s", ld->cfg.job);
  req.generation = ld->generation;
  req.rank = a->rank;
  req.step = ++a->step;
  req.loss = 2.0f / (float)(1 + a->step);
  req.samples_per_sec = 1000.0f;
  req.compute_ms = 10.0f + 0.1f * (float)(a->rank % 5); /* no stragglers */
  req.comm_wait_ms = 1.0f;
  if (a->hb_outstanding)
    ld->hb_overlaps++;
  a->hb_sent_ns = now;
  a->hb_outstanding++;
  ld->hb_sent++;
  if (send_request(a, "Heartbeat", gradsync_HeartbeatRequest_fields, &req, 2 + a->step, 0))
    fail(ld, "cannot send a heartbeat for rank %u", a->rank);
}

static void send_leave(agent_t *a)
{
  load_t *ld = a->ld;
  gradsync_LeaveRequest req = gradsync_LeaveRequest_init_zero;

  snprintf(req.job, sizeof(req.job), "%s", ld->cfg.job);
  req.generation = ld->generation;
  req.rank = a->rank;
  req.finished = true;
  if (send_request(a, "Leave", gradsync_LeaveRequest_fields, &req, 1ULL << 62, 0))
    fail(ld, "cannot send Leave for rank %u", a->rank);
}

/* --- replies --- */

static void all_joined(load_t *ld);

static void on_join_reply(agent_t *a, const gradsync_Envelope *env, const gs_buf_t *body)
{
  load_t *ld = a->ld;
  gradsync_JoinResponse resp = gradsync_JoinResponse_init_zero;
  gs_pb_array_t peers;
  const gradsync_Peer *p;
  uint32_t n = ld->cfg.ranks;
  char why[128];

  if (env->status) {
    fail(ld, "Join of agent %u failed: status %d: %s", a->index, env->status, env->message);
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
  if (resp.world_size != n || resp.rank >= n || ld->rank_seen[resp.rank] ||
      (ld->generation && resp.generation != ld->generation)) {
    fail(ld, "bad Join answer for agent %u: rank %u, world %u, generation %llu", a->index,
         resp.rank, resp.world_size, (unsigned long long)resp.generation);
  } else if (ld->cfg.peers == gradsync_PeerSet_PEERS_RING &&
             (peers.count != (n > 1 ? 2u : 1u) || p[0].rank != (resp.rank + n - 1) % n ||
              p[peers.count - 1].rank != (resp.rank + 1) % n)) {
    fail(ld, "rank %u got wrong ring neighbours", resp.rank);
  } else if (ld->cfg.peers == gradsync_PeerSet_PEERS_ALL && peers.count != n) {
    fail(ld, "rank %u got %zu peers, not %u", resp.rank, peers.count, n);
  } else {
    ld->rank_seen[resp.rank] = 1;
    snprintf(a->session, sizeof(a->session), "%s", resp.session);
    ld->generation = resp.generation;
    a->rank = resp.rank;
    a->joined = true;
    if (++ld->joined == n)
      all_joined(ld);
  }
  gs_pb_array_free(&peers);
}

static void on_heartbeat_reply(agent_t *a, const gradsync_Envelope *env, const gs_buf_t *body)
{
  load_t *ld = a->ld;
  gradsync_HeartbeatResponse resp = gradsync_HeartbeatResponse_init_zero;
  uint64_t now = uv_hrtime();

  if (a->hb_outstanding == 0) {
    fail(ld, "rank %u: a heartbeat reply nobody asked for", a->rank);
    return;
  }
  a->hb_outstanding--;
  ld->hb_replies++;
  if (env->status ||
      gs_wire_decode(body->data, body->len, gradsync_HeartbeatResponse_fields, &resp, NULL, 0)) {
    if (ld->hb_errors++ == 0)
      fprintf(stderr, "coord_load: rank %u: heartbeat failed: status %d: %s\n", a->rank,
              env->status, env->message);
    return;
  }
  if (resp.abort) {
    if (ld->hb_aborts++ == 0)
      fprintf(stderr, "coord_load: rank %u: generation aborted: %s\n", a->rank, resp.abort_reason);
    return;
  }
  if (a->hb_outstanding == 0 && ld->lat_count < ld->lat_cap)
    ld->lat_us[ld->lat_count++] = (uint32_t)((now - a->hb_sent_ns) / 1000);
}

static void agent_close(agent_t *a);

static void on_leave_reply(agent_t *a, const gradsync_Envelope *env)
{
  load_t *ld = a->ld;

  if (env->status)
    fail(ld, "Leave of rank %u failed: status %d: %s", a->rank, env->status, env->message);
  a->left = true;
  agent_close(a);
  if (++ld->left == ld->cfg.ranks)
    leave_done(ld);
}

/* One complete frame from the coordinator. */
static void on_frame(agent_t *a, const uint8_t *payload, size_t len)
{
  gradsync_Envelope env;
  gs_buf_t body = {0};
  char why[128];

  if (gs_wire_decode_envelope(payload, len, &env, &body, why, sizeof(why))) {
    fail(a->ld, "undecodable Envelope from the coordinator: %s", why);
  } else if (strcmp(env.method, GS_METHOD_PREFIX "Join") == 0) {
    on_join_reply(a, &env, &body);
  } else if (strcmp(env.method, GS_METHOD_PREFIX "Heartbeat") == 0) {
    on_heartbeat_reply(a, &env, &body);
  } else if (strcmp(env.method, GS_METHOD_PREFIX "Leave") == 0) {
    on_leave_reply(a, &env);
  } else {
    fail(a->ld, "unexpected reply '%s' (status %d: %s)", env.method, env.status, env.message);
  }
  gs_buf_free(&body);
}

/* Cuts frames out of data[0..len); returns the bytes used, < 0 on error. */
static long cut_frames(agent_t *a, const uint8_t *data, size_t len)
{
  size_t off = 0;

  while (!a->closed) {
    const uint8_t *payload;
    size_t plen;
    long used = gs_frame_parse(data + off, len - off, GS_FRAME_DEFAULT_MAX, &payload, &plen);

    if (used < 0)
      return used;
    if (used == 0)
      break;
    on_frame(a, payload, plen);
    off += (size_t)used;
  }
  return (long)off;
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
  agent_t *a = h->data;

  (void)suggested;
  *buf = uv_buf_init(a->ld->rbuf, sizeof(a->ld->rbuf));
}

/* Reads land in one shared buffer; only an incomplete frame's bytes are
 * kept per connection. */
static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
  agent_t *a = s->data;
  load_t *ld = a->ld;
  long used;

  if (nread < 0) {
    if (!a->left && ld->phase != PH_DONE)
      fail(ld, "coordinator closed the connection of agent %u (rank %u): %s", a->index, a->rank,
           uv_strerror((int)nread));
    agent_close(a);
    return;
  }
  if (nread == 0)
    return;
  if (a->rbuf.len == 0) {
    used = cut_frames(a, (const uint8_t *)buf->base, (size_t)nread);
    if (used >= 0 && used < nread && !a->closed &&
        gs_buf_append(&a->rbuf, buf->base + used, (size_t)(nread - used)))
      used = GS_ENOMEM;
  } else {
    used = gs_buf_append(&a->rbuf, buf->base, (size_t)nread);
    if (used == 0) {
      used = cut_frames(a, a->rbuf.data, a->rbuf.len);
      if (used > 0)
        gs_buf_consume(&a->rbuf, (size_t)used);
    }
  }
  if (used < 0)
    fail(ld, "bad frame from the coordinator: %s", gs_strerror((int)used));
}

/* --- connections --- */

static void on_closed(uv_handle_t *h)
{
  agent_t *a = h->data;

  gs_buf_free(&a->rbuf);
  a->ld->closed++;
}

static void agent_close(agent_t *a)
{
  if (a->closed)
    return;
  a->closed = true;
  uv_close((uv_handle_t *)&a->tcp, on_closed);
}

static void start_connects(load_t *ld);

static void on_connect(uv_connect_t *req, int status)
{
  agent_t *a = req->handle->data;
  load_t *ld = a->ld;

  ld->connects_in_flight--;
  if (status < 0) {
    agent_close(a);
    if (ld->phase == PH_JOIN)
      fail(ld, "connect to %s:%u failed for agent %u: %s%s", ld->cfg.host, ld->cfg.port, a->index,
           uv_strerror(status), status == UV_EMFILE ? " (raise RLIMIT_NOFILE: ulimit -n)" : "");
    return;
  }
  a->connected = true;
  if (++ld->connected == ld->cfg.ranks)
    ld->t_connected_ns = uv_hrtime();
  uv_tcp_nodelay(&a->tcp, 1);
  if (uv_read_start((uv_stream_t *)&a->tcp, on_alloc, on_read)) {
    fail(ld, "cannot read from the connection of agent %u", a->index);
    return;
  }
  send_join(a);
  start_connects(ld);
}

/* Keeps up to `window` connects in flight until every agent has one. */
static void start_connects(load_t *ld)
{
  struct sockaddr_storage addr;

  if (strchr(ld->cfg.host, ':'))
    uv_ip6_addr(ld->cfg.host, ld->cfg.port, (struct sockaddr_in6 *)&addr);
  else
    uv_ip4_addr(ld->cfg.host, ld->cfg.port, (struct sockaddr_in *)&addr);
  while (ld->phase == PH_JOIN && ld->next_connect < ld->cfg.ranks &&
         ld->connects_in_flight < ld->cfg.window) {
    agent_t *a = &ld->agents[ld->next_connect];
    int err;

    a->ld = ld;
    a->index = ld->next_connect++;
    uv_tcp_init(ld->loop, &a->tcp);
    a->tcp.data = a;
    err = uv_tcp_connect(&a->connect, &a->tcp, (struct sockaddr *)&addr, on_connect);
    if (err) {
      agent_close(a);
      fail(ld, "cannot connect agent %u: %s%s", a->index, uv_strerror(err),
           err == UV_EMFILE ? " (raise RLIMIT_NOFILE: ulimit -n)" : "");
      return;
    }
    ld->connects_in_flight++;
  }
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
  ld->self_cpu1 = self_cpu_s();
  if (ld->cfg.coord_pid && proc_cpu(ld->cfg.coord_pid, &ld->coord1) == 0)
    ld->coord_ok = true;
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
  if (ld->errors || ld->phase == PH_JOIN) {
    ld->phase = PH_DONE;
    for (uint32_t i = 0; i < ld->next_connect; i++)
      agent_close(&ld->agents[i]);
    close_handles(ld);
    return;
  }
  ld->phase = PH_LEAVE;
  uv_timer_start(&ld->deadline, on_deadline, 30000, 0);
  for (uint32_t i = 0; i < ld->cfg.ranks && ld->phase == PH_LEAVE; i++)
    send_leave(&ld->agents[i]);
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
  for (uint32_t i = 0; i < ld->cfg.ranks; i++)
    agent_close(&ld->agents[i]);
  close_handles(ld);
}

/* Sends the heartbeats due by now: rank slot i of the interval is due at
 * start + i * interval / N, so the load is smooth rather than a burst. */
static void on_tick(uv_timer_t *t)
{
  load_t *ld = t->data;
  uint64_t now = uv_hrtime(), elapsed = now - ld->hb_start_ns;
  uint64_t interval_ns = ld->cfg.interval_ms * 1000000ULL;
  uint64_t due =
      elapsed / interval_ns * ld->cfg.ranks + (elapsed % interval_ns) * ld->cfg.ranks / interval_ns;
  uint64_t warm_ns = ld->cfg.warmup_ms * 1000000ULL;

  while (ld->hb_sent < due && ld->phase == PH_HEARTBEAT)
    send_heartbeat(&ld->agents[ld->hb_sent % ld->cfg.ranks], now);
  if (!ld->window_open && elapsed >= warm_ns) {
    ld->window_open = true;
    ld->win_start_ns = now;
    ld->win_hb_replies0 = ld->hb_replies;
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
  uint32_t p50 = 0, p99 = 0, pmax = 0;

  if (win > 0) {
    rate = (ld->win_hb_replies1 - ld->win_hb_replies0) / win;
    self_pct = 100 * (ld->self_cpu1 - ld->self_cpu0) / win;
    if (ld->coord_ok) {
      user_pct = 100 * (ld->coord1.user_s - ld->coord0.user_s) / win;
      sys_pct = 100 * (ld->coord1.sys_s - ld->coord0.sys_s) / win;
      coord_pct = user_pct + sys_pct;
      wakeups = (double)(ld->coord1.wakeups - ld->coord0.wakeups) / win;
    }
  }
  if (ld->lat_count) {
    qsort(ld->lat_us, ld->lat_count, sizeof(uint32_t), cmp_u32);
    p50 = ld->lat_us[ld->lat_count / 2];
    p99 = ld->lat_us[ld->lat_count * 99 / 100];
    pmax = ld->lat_us[ld->lat_count - 1];
  }
  printf("coord_load: result ranks=%u connect_s=%.3f rendezvous_s=%.3f generation=%llu "
         "window_s=%.2f hb_sent=%llu hb_replies=%llu hb_per_s=%.0f hb_errors=%llu "
         "hb_aborts=%llu hb_overlaps=%llu hb_p50_ms=%.3f hb_p99_ms=%.3f hb_max_ms=%.3f "
         "coord_cpu_pct=%.2f coord_user_pct=%.2f coord_sys_pct=%.2f coord_wakeups_per_s=%.0f "
         "load_cpu_pct=%.2f left=%u errors=%d\n",
         ld->cfg.ranks, ld->t_connected_ns ? now_s(ld->t_connected_ns - ld->t_start_ns) : -1,
         ld->t_joined_ns ? now_s(ld->t_joined_ns - ld->t_start_ns) : -1,
         (unsigned long long)ld->generation, win, (unsigned long long)ld->hb_sent,
         (unsigned long long)ld->hb_replies, rate, (unsigned long long)ld->hb_errors,
         (unsigned long long)ld->hb_aborts, (unsigned long long)ld->hb_overlaps, p50 / 1000.0,
         p99 / 1000.0, pmax / 1000.0, coord_pct, user_pct, sys_pct, wakeups, self_pct, ld->left,
         ld->errors);
  fflush(stdout);
}

/* --- setup --- */

/* One descriptor per connection: raise the soft limit (and the hard one,
 * which root may) to what the run needs, or say why not. */
static int raise_fd_limit(uint32_t ranks)
{
  rlim_t need = (rlim_t)ranks + FD_HEADROOM;
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
            ranks, (unsigned long long)need, (unsigned long long)rl.rlim_max, strerror(errno));
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
    case OPT_DURATION: {
      uint64_t ms;

      if (gs_parse_duration_ms(optarg, &ms) ||
          (ms == 0 && opt != OPT_DURATION && opt != OPT_WARMUP))
        return bad(name, optarg, "a duration such as 500ms, 2s or 1m");
      *(opt == OPT_JOIN_TIMEOUT ? &cfg->join_timeout_ms
        : opt == OPT_INTERVAL   ? &cfg->interval_ms
        : opt == OPT_WARMUP     ? &cfg->warmup_ms
                                : &cfg->duration_ms) = ms;
      break;
    }
    case OPT_PID:
      if (gs_parse_long(optarg, 1, 1L << 30, &n))
        return bad(name, optarg, "a process id");
      cfg->coord_pid = n;
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
  ld->agents = calloc(ld->cfg.ranks, sizeof(*ld->agents));
  ld->rank_seen = calloc(ld->cfg.ranks, 1);
  /* Room for every reply of a timed run (10% slack); later ones go uncounted. */
  ld->lat_cap = (size_t)(ld->cfg.ranks * (windows / (double)ld->cfg.interval_ms) * 1.1) + 1024;
  ld->lat_us = malloc(ld->lat_cap * sizeof(*ld->lat_us));
  if (!ld->agents || !ld->rank_seen || !ld->lat_us) {
    fprintf(stderr, "coord_load: out of memory for %u ranks\n", ld->cfg.ranks);
    return 1;
  }
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
  if (rc == 0)
    rc = raise_fd_limit(ld->cfg.ranks);
  if (rc) {
    free(ld);
    return rc < 0 ? 0 : rc;
  }
  signal(SIGPIPE, SIG_IGN);
  uv_loop_init(&loop);
  rc = load_init(ld, &loop);
  if (rc == 0) {
    fprintf(stderr, "coord_load: %u ranks (%u per node) joining job %s at %s:%u\n", ld->cfg.ranks,
            ld->cfg.per_node, ld->cfg.job, ld->cfg.host, ld->cfg.port);
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
  free(ld->agents);
  free(ld->rank_seen);
  free(ld->lat_us);
  free(ld);
  return rc;
}
