/* Tests for agent/client/ (client.c, rpc.c, backoff.c, heartbeat.c)
 * against the real coordinator binary (started by the harness on free
 * ports): rendezvous, blobs, pack lists, refused calls, deadlines,
 * reconnecting, resending, stale replies, and the heartbeat thread's
 * directives and aborts. */
#include <arpa/inet.h>
#include <check.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "client.h"
#include "harness.h"
#include "heartbeat.h"
#include "clock.h"
#include "runner.h"

#define COUNT(a) ((uint32_t)(sizeof(a) / sizeof((a)[0])))

static const gs_log_t quiet = {.level = GS_LOG_ERROR, .component = "test"};

static void sleep_ms(unsigned ms)
{
  struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000};

  nanosleep(&ts, NULL);
}

/* Whether the log a client or heartbeat writes to `f` (a line at a time,
 * flushed) holds `needle` yet; safe while another thread writes it. */
static bool log_has(FILE *f, const char *needle)
{
  struct stat st;
  char *text;
  bool found;

  if (fstat(fileno(f), &st) != 0 || st.st_size == 0)
    return false;
  text = calloc(1, (size_t)st.st_size + 1);
  ck_assert_ptr_nonnull(text);
  found = pread(fileno(f), text, (size_t)st.st_size, 0) > 0 && strstr(text, needle);
  free(text);
  return found;
}

/* Waits up to TH_WAIT_MS for `needle` in the log `f`; false if it never came. */
static bool wait_log(FILE *f, const char *needle)
{
  for (uint64_t deadline = gs_now_ms() + TH_WAIT_MS; gs_now_ms() < deadline; sleep_ms(10))
    if (log_has(f, needle))
      return true;
  return false;
}

/* Waits up to TH_WAIT_MS until the /metrics line `name` reaches `value`. */
static void wait_metric(uint16_t port, const char *name, double value)
{
  double got = -1;

  for (uint64_t deadline = gs_now_ms() + TH_WAIT_MS; gs_now_ms() < deadline; sleep_ms(10))
    if ((got = th_metric(port, name)) >= value)
      return;
  ck_abort_msg("%s is %g, not %g, after %d ms", name, got, value, TH_WAIT_MS);
}

static gs_client_config_t client_config(uint16_t port, const char *job, const char *token)
{
  gs_client_config_t cfg = {.port = port, .token = token, .job = job, .log = &quiet};

  snprintf(cfg.host, sizeof(cfg.host), "127.0.0.1");
  return cfg;
}

static gs_client_t *new_client(uint16_t port, const char *job, const char *token)
{
  gs_client_config_t cfg = client_config(port, job, token);
  gs_client_t *cl = gs_client_new(&cfg);

  ck_assert_ptr_nonnull(cl);
  return cl;
}

/* A port nothing listens on (bound once by us, then released). */
/* A loopback port bound and not listening: a connect to it is refused,
 * and no other process (a test beside this one) can take it meanwhile.
 * The caller closes *fd. */
static uint16_t bound_port(int *fd)
{
  struct sockaddr_in sa = {.sin_family = AF_INET};
  socklen_t len = sizeof(sa);

  *fd = socket(AF_INET, SOCK_STREAM, 0);
  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  ck_assert_int_eq(bind(*fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
  ck_assert_int_eq(getsockname(*fd, (struct sockaddr *)&sa, &len), 0);
  return ntohs(sa.sin_port);
}

static uint16_t reserve_port(void)
{
  int fd;
  uint16_t port = bound_port(&fd);

  close(fd);
  return port;
}

/* Joins a world of one and returns its generation. */
static uint64_t join_alone(gs_client_t *cl, const char *node)
{
  gradsync_JoinRequest req = th_join_request("x", 1, node, 0);
  gs_join_result_t r;
  uint64_t g;

  ck_assert_msg(gs_client_join(cl, &req, TH_WAIT_MS, &r) == 0, "join: %s", gs_client_error(cl));
  g = r.generation;
  gs_join_result_free(&r);
  return g;
}

/* One agent joining from its own thread. */
typedef struct joiner {
  pthread_t thread;
  uint16_t port;
  const char *job;
  const char *node;
  uint32_t world;
  uint64_t timeout_ms;
  gs_client_t *cl; /* kept open after the join: its connection is the rank */
  gs_log_t log;    /* with joiner_log: INFO lines, a progress line every 20 ms */
  gs_join_result_t r;
  int err;
  uint64_t elapsed_ms;
  char error[768];
} joiner_t;

static void *join_thread(void *arg)
{
  joiner_t *j = arg;
  gradsync_JoinRequest req = th_join_request("x", j->world, j->node, 0);
  uint64_t t0 = gs_now_ms();

  j->err = gs_client_join(j->cl, &req, j->timeout_ms, &j->r);
  j->elapsed_ms = gs_now_ms() - t0;
  snprintf(j->error, sizeof(j->error), "%s", gs_client_error(j->cl));
  return NULL;
}

/* Starts a joiner; with `log`, its client logs there at INFO and says
 * every 20 ms what it waits for. */
static void joiner_log(joiner_t *j, uint16_t port, const char *job, const char *node,
                       uint32_t world, uint64_t timeout_ms, FILE *log)
{
  gs_client_config_t cfg = client_config(port, job, NULL);

  memset(j, 0, sizeof(*j));
  j->port = port;
  j->job = job;
  j->node = node;
  j->world = world;
  j->timeout_ms = timeout_ms;
  j->log = (gs_log_t){.level = GS_LOG_INFO, .out = log, .component = "test"};
  if (log)
    cfg.log = &j->log;
  j->cl = gs_client_new(&cfg);
  ck_assert_ptr_nonnull(j->cl);
  if (log)
    gs_client_set_progress_interval(j->cl, 20);
  ck_assert_int_eq(pthread_create(&j->thread, NULL, join_thread, j), 0);
}

static void joiner_start(joiner_t *j, uint16_t port, const char *job, const char *node,
                         uint32_t world, uint64_t timeout_ms)
{
  joiner_log(j, port, job, node, world, timeout_ms, NULL);
}

static void joiner_wait(joiner_t *j)
{
  ck_assert_int_eq(pthread_join(j->thread, NULL), 0);
  ck_assert_msg(j->err == 0, "join of node %s: %s: %s", j->node, gs_err_name(j->err), j->error);
}

static void joiner_free(joiner_t *j)
{
  gs_join_result_free(&j->r);
  gs_client_free(j->cl);
  j->cl = NULL;
}

START_TEST(join_world1)
{
  th_coord_t co;
  gs_client_t *cl;
  gradsync_JoinRequest req;
  gs_join_result_t r;

  th_coord_start(&co, "--heartbeat-interval", "250ms", "--heartbeat-timeout", "3s", NULL);
  cl = new_client(co.rpc_port, "solo", NULL);
  req = th_join_request("overwritten", 1, "nodeA", 0);
  req.bcast_period = 5;
  ck_assert_msg(gs_client_join(cl, &req, TH_WAIT_MS, &r) == 0, "%s", gs_client_error(cl));
  ck_assert_str_eq(req.job, "solo");
  ck_assert_uint_eq(r.rank, 0);
  ck_assert_uint_eq(r.world_size, 1);
  ck_assert_uint_eq(r.generation, 1);
  ck_assert_int_eq(r.bcast_period, 5);
  ck_assert_uint_eq(r.heartbeat_interval_ms, 250);
  ck_assert_uint_eq(r.heartbeat_timeout_ms, 3000);
  ck_assert_ptr_nonnull(r.peers);
  ck_assert_uint_eq(r.peers[0].rank, 0);
  ck_assert_str_eq(r.peers[0].node, "nodeA");
  ck_assert_str_eq(r.peers[0].device, "cpu");
  ck_assert_str_eq(r.peers[0].comm_addr, "nodeA:9000");
  gs_join_result_free(&r);
  ck_assert_ptr_null(r.peers);
  gs_client_free(cl);
  ck_assert_int_eq(th_coord_stop(&co), 0);
}
END_TEST

START_TEST(join_world2_threads)
{
  th_coord_t co;
  joiner_t j[2];

  th_coord_start(&co, NULL);
  /* "b" arrives first but sorts second. */
  joiner_start(&j[0], co.rpc_port, "pair", "b", 2, TH_WAIT_MS);
  free(th_http_wait(co.http_port, "/status", "\"rendezvous\":{\"joined\":1,"));
  joiner_start(&j[1], co.rpc_port, "pair", "a", 2, TH_WAIT_MS);
  joiner_wait(&j[0]);
  joiner_wait(&j[1]);
  ck_assert_uint_eq(j[1].r.rank, 0);
  ck_assert_uint_eq(j[0].r.rank, 1);
  for (int i = 0; i < 2; i++) {
    ck_assert_uint_eq(j[i].r.world_size, 2);
    ck_assert_uint_eq(j[i].r.generation, 1);
    ck_assert_str_eq(j[i].r.peers[0].comm_addr, "a:9000");
    ck_assert_str_eq(j[i].r.peers[1].comm_addr, "b:9000");
    ck_assert_str_eq(j[i].r.peers[1].node, "b");
    ck_assert_uint_eq(j[i].r.peers[1].rank, 1);
    joiner_free(&j[i]);
  }
  ck_assert_int_eq(th_coord_stop(&co), 0);
}
END_TEST

/* A Fetch from its own thread. */
typedef struct fetcher {
  pthread_t thread;
  gs_client_t *cl;
  uint64_t generation;
  const char *key;
  uint8_t value[64];
  size_t len;
  int err;
  uint64_t elapsed_ms;
} fetcher_t;

static void *fetch_thread(void *arg)
{
  fetcher_t *f = arg;
  uint64_t t0 = gs_now_ms();

  f->err = gs_client_fetch(f->cl, f->generation, f->key, f->value, sizeof(f->value), &f->len,
                           TH_WAIT_MS);
  f->elapsed_ms = gs_now_ms() - t0;
  return NULL;
}

START_TEST(publish_fetch)
{
  th_coord_t co;
  gs_client_t *a, *b;
  uint8_t blob[128], got[256], small[16];
  fetcher_t f = {0};
  size_t len = 0;
  double fetches;
  uint64_t g;

  th_coord_start(&co, NULL);
  a = new_client(co.rpc_port, "blobs", NULL);
  b = new_client(co.rpc_port, "blobs", NULL);
  g = join_alone(a, "n0");
  for (size_t i = 0; i < sizeof(blob); i++)
    blob[i] = (uint8_t)(i * 37 + 11);
  /* Blobs are the generation's members' only: b has no session yet. */
  ck_assert_int_eq(gs_client_fetch(b, g, "nccl-id", got, sizeof(got), &len, TH_WAIT_MS), GS_EPERM);
  gs_client_set_session(b, gs_client_session(a)); /* now it acts for a's rank */
  ck_assert_msg(gs_client_publish(a, g, "nccl-id", blob, sizeof(blob), TH_WAIT_MS) == 0, "%s",
                gs_client_error(a));
  ck_assert_msg(gs_client_fetch(b, g, "nccl-id", got, sizeof(got), &len, TH_WAIT_MS) == 0, "%s",
                gs_client_error(b));
  ck_assert_uint_eq(len, sizeof(blob));
  ck_assert_mem_eq(got, blob, sizeof(blob));
  /* A buffer too small says how much is needed. */
  ck_assert_int_eq(gs_client_fetch(b, g, "nccl-id", small, sizeof(small), &len, TH_WAIT_MS),
                   GS_ERANGE);
  ck_assert_uint_eq(len, sizeof(blob));
  ck_assert_ptr_nonnull(strstr(gs_client_error(b), "nccl-id"));

  /* A fetch that waits for a later publish: published once the
   * coordinator has the fetch. */
  f.cl = b;
  f.generation = g;
  f.key = "late";
  fetches = th_metric(co.http_port, "gradsync_rpc_requests_total{method=\"Fetch\"}");
  ck_assert_int_eq(pthread_create(&f.thread, NULL, fetch_thread, &f), 0);
  wait_metric(co.http_port, "gradsync_rpc_requests_total{method=\"Fetch\"}", fetches + 1);
  ck_assert_msg(gs_client_publish(a, g, "late", "hello", 5, TH_WAIT_MS) == 0, "%s",
                gs_client_error(a));
  ck_assert_int_eq(pthread_join(f.thread, NULL), 0);
  ck_assert_msg(f.err == 0, "%s", gs_client_error(b));
  ck_assert_uint_eq(f.len, 5);
  ck_assert_mem_eq(f.value, "hello", 5);
  gs_client_free(a);
  gs_client_free(b);
  ck_assert_int_eq(th_coord_stop(&co), 0);
}
END_TEST

START_TEST(packlist_roundtrip)
{
  static const gs_param_desc_t params[] = {
      {"emb.weight", 1000, GS_DTYPE_FLOAT32}, {"fc1.weight", 4096, GS_DTYPE_FLOAT32},
      {"fc1.bias", 64, GS_DTYPE_FLOAT32},     {"fc2.weight", 2048, GS_DTYPE_FLOAT16},
      {"fc2.bias", 32, GS_DTYPE_FLOAT16},     {"out.weight", 640, GS_DTYPE_FLOAT32},
  };
  th_coord_t co;
  gs_client_t *r0, *r1;
  gs_packlist_t list, got;
  gs_param_desc_t *gp = NULL;
  uint32_t n = 0;
  uint64_t g;

  th_coord_start(&co, NULL);
  r0 = new_client(co.rpc_port, "packs", NULL);
  r1 = new_client(co.rpc_port, "packs", NULL);
  g = join_alone(r0, "n0");                         /* th_join_request's signature has 6 params */
  gs_client_set_session(r1, gs_client_session(r0)); /* a second connection of rank 0 */
  ck_assert_int_eq(gs_packlist_compute(params, COUNT(params), 8192, &list), 0);
  ck_assert_uint_gt(list.pack_count, 2);
  /* Only rank 0 may publish (here r1 claims rank 1). */
  ck_assert_int_eq(gs_client_publish_packlist(r1, g, 1, &list, params, COUNT(params), TH_WAIT_MS),
                   GS_EPERM);
  ck_assert_msg(gs_client_publish_packlist(r0, g, 0, &list, params, COUNT(params), TH_WAIT_MS) == 0,
                "%s", gs_client_error(r0));
  ck_assert_msg(gs_client_fetch_packlist(r1, g, &got, &gp, &n, TH_WAIT_MS) == 0, "%s",
                gs_client_error(r1));
  ck_assert_uint_eq(got.threshold_bytes, 8192);
  ck_assert_uint_eq(got.pack_count, list.pack_count);
  ck_assert_uint_eq(got.param_count, list.param_count);
  ck_assert_mem_eq(got.pack_sizes, list.pack_sizes, list.pack_count * sizeof(uint32_t));
  ck_assert_mem_eq(got.order, list.order, list.param_count * sizeof(uint32_t));
  ck_assert_uint_eq(n, COUNT(params));
  for (uint32_t i = 0; i < n; i++) {
    ck_assert_str_eq(gp[i].name, params[i].name);
    ck_assert_uint_eq(gp[i].elements, params[i].elements);
    ck_assert_int_eq(gp[i].dtype, params[i].dtype);
  }
  gs_client_params_free(gp, n);
  gs_packlist_free(&got);
  gs_packlist_free(&list);
  gs_client_free(r0);
  gs_client_free(r1);
  ck_assert_int_eq(th_coord_stop(&co), 0);
}
END_TEST

START_TEST(refused_call)
{
  th_coord_t co;
  gs_client_t *cl;
  gradsync_JoinRequest req;
  gs_join_result_t r;

  th_coord_start(&co, NULL);
  cl = new_client(co.rpc_port, "refused", NULL);
  req = th_join_request("x", 0, "n0", 0);
  ck_assert_int_eq(gs_client_join(cl, &req, TH_WAIT_MS, &r), GS_EINVAL);
  ck_assert_msg(strstr(gs_client_error(cl), "world_size 0 is out of range"), "error: %s",
                gs_client_error(cl));
  ck_assert_ptr_null(r.peers);
  /* The connection stays usable. */
  join_alone(cl, "n0");
  gs_client_free(cl);
  ck_assert_int_eq(th_coord_stop(&co), 0);
}
END_TEST

START_TEST(nothing_listening)
{
  int held;
  uint16_t port = bound_port(&held);
  gs_client_t *cl = new_client(port, "void", NULL);
  gradsync_JoinRequest req = th_join_request("x", 1, "n0", 0);
  gs_join_result_t r;
  char addr[32];
  uint64_t t0 = gs_now_ms(), elapsed;

  /* Not before its deadline (how soon after it is no test's business);
   * the deadline long enough that even a starved process tries once (on
   * a loaded machine 300 ms once passed before its first connect). */
  ck_assert_int_eq(gs_client_join(cl, &req, 2000, &r), GS_ETIMEDOUT);
  elapsed = gs_now_ms() - t0;
  ck_assert_uint_ge(elapsed, 1990);
  snprintf(addr, sizeof(addr), "127.0.0.1:%u", port);
  ck_assert_msg(strstr(gs_client_error(cl), addr), "error: %s", gs_client_error(cl));
  ck_assert_msg(strstr(gs_client_error(cl), "refused"), "error: %s", gs_client_error(cl));
  gs_client_free(cl);
  close(held);
}
END_TEST

/* A Join started while no coordinator listens is retried until one does:
 * the coordinator starts once the client said it found none. */
START_TEST(reconnect)
{
  uint16_t port = reserve_port();
  char listen[32];
  th_coord_t co;
  joiner_t j;
  FILE *f = tmpfile();

  snprintf(listen, sizeof(listen), "127.0.0.1:%u", port);
  joiner_log(&j, port, "late-coord", "n0", 1, TH_WAIT_MS, f);
  ck_assert_msg(wait_log(f, "coordinator unreachable at"), "the client never said it found none");
  th_coord_start(&co, "--listen", listen, NULL);
  ck_assert_uint_eq(co.rpc_port, port);
  joiner_wait(&j);
  ck_assert_uint_eq(j.r.world_size, 1);
  joiner_free(&j);
  fclose(f);
  ck_assert_int_eq(th_coord_stop(&co), 0);
}
END_TEST

/* A Join parked on a coordinator that dies is resent to its successor,
 * where it completes the rendezvous with an agent that joined only there. */
START_TEST(resend_in_flight)
{
  uint16_t port = reserve_port();
  char listen[32];
  th_coord_t co;
  joiner_t a, b;

  snprintf(listen, sizeof(listen), "127.0.0.1:%u", port);
  th_coord_start(&co, "--listen", listen, NULL);
  joiner_start(&a, port, "phoenix", "a", 2, TH_WAIT_MS);
  free(th_http_wait(co.http_port, "/status", "\"rendezvous\":{\"joined\":1,"));
  th_coord_kill(&co);
  th_coord_start(&co, "--listen", listen, NULL);
  joiner_start(&b, port, "phoenix", "b", 2, TH_WAIT_MS);
  joiner_wait(&a);
  joiner_wait(&b);
  ck_assert_uint_eq(a.r.rank, 0);
  ck_assert_uint_eq(b.r.rank, 1);
  ck_assert_uint_eq(a.r.generation, 1);
  ck_assert_str_eq(a.r.peers[1].comm_addr, "b:9000");
  joiner_free(&a);
  joiner_free(&b);
  ck_assert_int_eq(th_coord_stop(&co), 0);
}
END_TEST

/* A reply that arrives after its call gave up must not answer the next call. */
START_TEST(stale_reply_skipped)
{
  th_coord_t co;
  gs_client_t *a, *b;
  gradsync_FetchRequest req = gradsync_FetchRequest_init_zero;
  gradsync_FetchResponse resp = gradsync_FetchResponse_init_zero;
  uint8_t got[16];
  size_t len = 0;
  uint64_t g;

  th_coord_start(&co, NULL);
  a = new_client(co.rpc_port, "stale", NULL);
  b = new_client(co.rpc_port, "stale", NULL);
  g = join_alone(b, "n0");
  gs_client_set_session(a, gs_client_session(b));
  snprintf(req.job, sizeof(req.job), "stale");
  req.generation = g;
  snprintf(req.key, sizeof(req.key), "x");
  /* The coordinator keeps it parked for 3 s; we give up after 200 ms. */
  ck_assert_int_eq(gs_client_call(a, GS_METHOD_FETCH, gradsync_FetchRequest_fields, &req,
                                  gradsync_FetchResponse_fields, &resp, 3000, 200),
                   GS_ETIMEDOUT);
  ck_assert_msg(strstr(gs_client_error(a), "Fetch"), "error: %s", gs_client_error(a));
  ck_assert_int_eq(gs_client_publish(b, g, "x", "old", 3, TH_WAIT_MS),
                   0); /* answers the stale call */
  ck_assert_int_eq(gs_client_publish(b, g, "y", "new", 3, TH_WAIT_MS), 0);
  ck_assert_msg(gs_client_fetch(a, g, "y", got, sizeof(got), &len, TH_WAIT_MS) == 0, "%s",
                gs_client_error(a));
  ck_assert_uint_eq(len, 3);
  ck_assert_mem_eq(got, "new", 3);
  gs_client_free(a);
  gs_client_free(b);
  ck_assert_int_eq(th_coord_stop(&co), 0);
}
END_TEST

START_TEST(token)
{
  th_coord_t co;
  gs_client_t *good, *bad;
  gradsync_JoinRequest req = th_join_request("x", 1, "n1", 0);
  gs_join_result_t r;

  th_coord_start(&co, "--token", "s3cret", NULL);
  good = new_client(co.rpc_port, "secure", "s3cret");
  bad = new_client(co.rpc_port, "secure", NULL);
  ck_assert_int_eq(gs_client_join(bad, &req, TH_WAIT_MS, &r), GS_EUNAUTH);
  ck_assert_msg(strstr(gs_client_error(bad), "missing token"), "%s", gs_client_error(bad));
  join_alone(good, "n0");
  gs_client_free(good);
  gs_client_free(bad);
  ck_assert_int_eq(th_coord_stop(&co), 0);
}
END_TEST

/* What on_abort saw. */
typedef struct abort_rec {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  int count;
  char why[512];
  uint64_t at_ms;
} abort_rec_t;

static void on_abort(void *arg, uint64_t generation, const char *why)
{
  abort_rec_t *a = arg;

  (void)generation;

  pthread_mutex_lock(&a->lock);
  a->count++;
  a->at_ms = gs_now_ms();
  snprintf(a->why, sizeof(a->why), "%s", why);
  pthread_cond_broadcast(&a->cond);
  pthread_mutex_unlock(&a->lock);
}

static void abort_rec_init(abort_rec_t *a)
{
  memset(a, 0, sizeof(*a));
  pthread_mutex_init(&a->lock, NULL);
  pthread_cond_init(&a->cond, NULL);
}

/* Waits up to ms for on_abort; returns how often it fired. */
static int wait_abort(abort_rec_t *a, unsigned ms)
{
  struct timespec ts;
  int count;

  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_sec += ms / 1000;
  ts.tv_nsec += (long)(ms % 1000) * 1000000;
  if (ts.tv_nsec >= 1000000000) {
    ts.tv_sec++;
    ts.tv_nsec -= 1000000000;
  }
  pthread_mutex_lock(&a->lock);
  while (a->count == 0 && pthread_cond_timedwait(&a->cond, &a->lock, &ts) == 0)
    ;
  count = a->count;
  pthread_mutex_unlock(&a->lock);
  return count;
}

static gs_heartbeat_t *start_heartbeat(uint16_t port, const char *job, uint64_t generation,
                                       uint32_t rank, uint32_t interval_ms, uint32_t timeout_ms,
                                       abort_rec_t *rec, const char *session)
{
  gs_heartbeat_config_t cfg = {
      .client = client_config(port, job, NULL),
      .generation = generation,
      .session = session,
      .rank = rank,
      .interval_ms = interval_ms,
      .timeout_ms = timeout_ms,
      .on_abort = on_abort,
      .arg = rec,
  };
  gs_heartbeat_t *hb = gs_heartbeat_start(&cfg);

  ck_assert_ptr_nonnull(hb);
  return hb;
}

/* Waits up to ms for the first heartbeat reply. */
static void wait_valid(gs_heartbeat_t *hb, unsigned ms)
{
  gs_directives_t d = {0};
  uint64_t end = gs_now_ms() + ms;

  do {
    gs_heartbeat_directives(hb, &d);
    if (d.valid)
      return;
    sleep_ms(10);
  } while (gs_now_ms() < end);
  ck_abort_msg("no heartbeat reply within %u ms", ms);
}

START_TEST(heartbeat_directives)
{
  th_coord_t co;
  gs_client_t *cl;
  gs_heartbeat_t *hb;
  gs_directives_t d = {0};
  gs_progress_t p = {.step = 42, .loss = 0.5f};
  abort_rec_t rec;
  char *body = NULL;
  uint64_t g, end;

  abort_rec_init(&rec);
  th_coord_start(&co, NULL);
  cl = new_client(co.rpc_port, "hbd", NULL);
  g = join_alone(cl, "n0");
  hb = start_heartbeat(co.rpc_port, "hbd", g, 0, 100, TH_WAIT_MS, &rec, gs_client_session(cl));
  gs_heartbeat_report(hb, &p);
  wait_valid(hb, TH_WAIT_MS);
  ck_assert_int_eq(th_http(co.http_port, "POST", "/jobs/hbd/control", NULL,
                           "{\"bcast_period\": 7, \"action\": \"checkpoint\"}", &body),
                   200);
  free(body);
  end = gs_now_ms() + TH_WAIT_MS;
  do {
    sleep_ms(20);
    gs_heartbeat_directives(hb, &d);
  } while ((d.bcast_period != 7 || d.checkpoint_seq != 1) && gs_now_ms() < end);
  ck_assert(d.valid);
  ck_assert_int_eq(d.bcast_period, 7);
  ck_assert_uint_eq(d.checkpoint_seq, 1);
  ck_assert_uint_eq(d.broadcast_seq, 0);
  ck_assert(!d.stop);
  /* The reported progress reached the coordinator. */
  ck_assert_int_eq(th_http(co.http_port, "GET", "/jobs/hbd", NULL, NULL, &body), 200);
  ck_assert_msg(strstr(body, "\"step\":42"), "status: %s", body);
  free(body);
  ck_assert(!gs_heartbeat_aborted(hb, NULL, 0));
  gs_heartbeat_stop(hb);
  ck_assert_int_eq(rec.count, 0);
  gs_client_free(cl);
  ck_assert_int_eq(th_coord_stop(&co), 0);
}
END_TEST

/* Rank 1's connection closes (it never heartbeats): the coordinator
 * aborts the generation and rank 0's heartbeat fires on_abort, once. The
 * heartbeat timeout is far past the test's waits: the close alone does it. */
START_TEST(heartbeat_abort)
{
  th_coord_t co;
  joiner_t j[2];
  gs_heartbeat_t *hb;
  abort_rec_t rec;
  char why[512] = "";

  abort_rec_init(&rec);
  th_coord_start(&co, "--heartbeat-interval", "100ms", "--heartbeat-timeout", "600s", NULL);
  joiner_start(&j[0], co.rpc_port, "hba", "a", 2, TH_WAIT_MS);
  joiner_start(&j[1], co.rpc_port, "hba", "b", 2, TH_WAIT_MS);
  joiner_wait(&j[0]);
  joiner_wait(&j[1]);
  ck_assert_uint_eq(j[1].r.rank, 1);
  hb = start_heartbeat(co.rpc_port, "hba", j[0].r.generation, 0, 100, TH_WAIT_MS, &rec,
                       j[0].r.session);
  wait_valid(hb, TH_WAIT_MS);
  ck_assert_int_eq(rec.count, 0);
  joiner_free(&j[1]); /* rank 1's connection closes; it never heartbeats */
  ck_assert_int_eq(wait_abort(&rec, TH_WAIT_MS), 1);
  ck_assert_msg(strstr(rec.why, "rank 1"), "reason: %s", rec.why);
  ck_assert(gs_heartbeat_aborted(hb, why, sizeof(why)));
  ck_assert_str_eq(why, rec.why);
  gs_heartbeat_stop(hb);
  ck_assert_int_eq(rec.count, 1); /* once only: the thread is gone now */
  joiner_free(&j[0]);
  ck_assert_int_eq(th_coord_stop(&co), 0);
}
END_TEST

START_TEST(heartbeat_unreachable)
{
  th_coord_t co;
  gs_client_t *cl;
  gs_heartbeat_t *hb;
  abort_rec_t rec;
  uint64_t g, t0, after;

  abort_rec_init(&rec);
  th_coord_start(&co, NULL);
  cl = new_client(co.rpc_port, "hbu", NULL);
  g = join_alone(cl, "n0");
  /* Its silence clock starts after t0: on_abort cannot come before t0 +
   * 800 ms (the kill comes right after the first reply; how soon after
   * the timeout on_abort comes is no test's business). */
  t0 = gs_now_ms();
  hb = start_heartbeat(co.rpc_port, "hbu", g, 0, 100, 800, &rec, gs_client_session(cl));
  wait_valid(hb, TH_WAIT_MS);
  th_coord_kill(&co);
  ck_assert_int_eq(wait_abort(&rec, TH_WAIT_MS), 1);
  after = rec.at_ms - t0;
  ck_assert_msg(after >= 800, "on_abort %llu ms after the heartbeat started",
                (unsigned long long)after);
  ck_assert_msg(strstr(rec.why, "coordinator unreachable for "), "reason: %s", rec.why);
  ck_assert_msg(strstr(rec.why, "127.0.0.1"), "reason: %s", rec.why);
  gs_heartbeat_stop(hb);
  ck_assert_int_eq(rec.count, 1);
  gs_client_free(cl);
}
END_TEST

/* A restarted coordinator answers NOT_FOUND: no abort before the timeout. */
START_TEST(heartbeat_restart_not_abort)
{
  uint16_t port = reserve_port();
  char listen[32];
  th_coord_t co;
  gs_client_t *cl;
  gs_heartbeat_t *hb;
  abort_rec_t rec;
  uint64_t g;

  abort_rec_init(&rec);
  snprintf(listen, sizeof(listen), "127.0.0.1:%u", port);
  th_coord_start(&co, "--listen", listen, NULL);
  cl = new_client(port, "hbr", NULL);
  g = join_alone(cl, "n0");
  hb = start_heartbeat(port, "hbr", g, 0, 100, TH_WAIT_MS, &rec, gs_client_session(cl));
  wait_valid(hb, TH_WAIT_MS);
  th_coord_kill(&co);
  th_coord_start(&co, "--listen", listen, NULL);
  /* Two NOT_FOUND replies from the new one: the first was taken as what it is. */
  wait_metric(co.http_port, "gradsync_rpc_requests_total{method=\"Heartbeat\"}", 2);
  ck_assert_int_eq(rec.count, 0);
  ck_assert(!gs_heartbeat_aborted(hb, NULL, 0));
  gs_heartbeat_stop(hb);
  gs_client_free(cl);
  ck_assert_int_eq(th_coord_stop(&co), 0);
}
END_TEST

/* A heartbeat with its rank's Join re-registers the rank at a restarted
 * coordinator; one whose owner left the generation
 * (gs_heartbeat_forgo_rejoin: it joins the next one, with a new comm
 * address) does not. Both beat at the same restarted coordinator. */
START_TEST(heartbeat_forgone_rejoin)
{
  uint16_t port = reserve_port();
  gradsync_JoinRequest req = th_join_request("x", 1, "n0", 0);
  const char *jobs[2] = {"hbkeep", "hbleft"};
  char listen[32], path[32], *body = NULL;
  gs_client_t *cl[2];
  gs_heartbeat_t *hb[2];
  abort_rec_t rec;
  th_coord_t co;

  abort_rec_init(&rec);
  snprintf(listen, sizeof(listen), "127.0.0.1:%u", port);
  th_coord_start(&co, "--listen", listen, NULL);
  for (int i = 0; i < 2; i++) {
    gs_heartbeat_config_t cfg = {
        .client = client_config(port, jobs[i], NULL),
        .generation = 0,
        .rank = 0,
        .world_size = 1,
        .interval_ms = 100,
        .timeout_ms = TH_WAIT_MS,
        .on_abort = on_abort,
        .arg = &rec,
        .rejoin = &req,
    };

    cl[i] = new_client(port, jobs[i], NULL);
    cfg.generation = join_alone(cl[i], "n0");
    cfg.session = gs_client_session(cl[i]);
    hb[i] = gs_heartbeat_start(&cfg);
    ck_assert_ptr_nonnull(hb[i]);
    wait_valid(hb[i], TH_WAIT_MS);
  }
  gs_heartbeat_forgo_rejoin(hb[1]);
  th_coord_kill(&co);
  th_coord_start(&co, "--listen", listen, NULL);
  for (uint64_t end = gs_now_ms() + TH_WAIT_MS; gs_now_ms() < end; sleep_ms(20)) {
    int status = th_http(co.http_port, "GET", "/jobs/hbkeep", NULL, NULL, &body);

    free(body);
    body = NULL;
    if (status == 200)
      break;
  }
  /* hbkeep is back; hbleft has beaten since (NOT_FOUND, each answer a
   * moment after which it would have re-registered) and stays gone. */
  wait_metric(co.http_port, "gradsync_rpc_requests_total{method=\"Heartbeat\"}", 8);
  snprintf(path, sizeof(path), "/jobs/%s", jobs[0]);
  ck_assert_int_eq(th_http(co.http_port, "GET", path, NULL, NULL, &body), 200);
  free(body);
  snprintf(path, sizeof(path), "/jobs/%s", jobs[1]);
  ck_assert_int_eq(th_http(co.http_port, "GET", path, NULL, NULL, &body), 404);
  free(body);
  for (int i = 0; i < 2; i++) {
    gs_heartbeat_stop(hb[i]);
    gs_client_free(cl[i]);
  }
  ck_assert_int_eq(rec.count, 0);
  ck_assert_int_eq(th_coord_stop(&co), 0);
}
END_TEST

START_TEST(heartbeat_stop_latency)
{
  th_coord_t co;
  gs_client_t *cl;
  gs_heartbeat_t *hb;
  abort_rec_t rec;
  uint64_t g, t0;

  abort_rec_init(&rec);
  th_coord_start(&co, NULL);
  cl = new_client(co.rpc_port, "hbs", NULL);
  g = join_alone(cl, "n0");
  /* An hour between heartbeats: a stop that waited for the next one would
   * fail here rather than pass slowly (how soon it ends is bench/'s). */
  hb = start_heartbeat(co.rpc_port, "hbs", g, 0, 3600000, 7200000, &rec, gs_client_session(cl));
  wait_valid(hb, TH_WAIT_MS); /* the first heartbeat goes out at once */
  t0 = gs_now_ms();
  gs_heartbeat_stop(hb);
  ck_assert_uint_lt(gs_now_ms() - t0, TH_WAIT_MS);
  gs_heartbeat_stop(NULL);
  gs_client_free(cl);
  ck_assert_int_eq(th_coord_stop(&co), 0);
}
END_TEST

/* The log lines a client or heartbeat wrote to a temporary file. */
static char *log_text(FILE *f)
{
  long n;
  char *text;

  fflush(f);
  n = ftell(f);
  text = calloc(1, (size_t)n + 1);
  ck_assert_ptr_nonnull(text);
  rewind(f);
  ck_assert_uint_eq(fread(text, 1, (size_t)n, f), (size_t)n);
  return text;
}

/* Sets a signal flag from another thread, as a handler would, once the
 * log `log` holds `after` (or, if it never does, at TH_WAIT_MS: the test
 * then fails on the log). */
typedef struct raiser {
  pthread_t thread;
  volatile sig_atomic_t flag;
  FILE *log;
  const char *after;
  int sig;
} raiser_t;

static void *raise_thread(void *arg)
{
  raiser_t *r = arg;

  (void)wait_log(r->log, r->after);
  r->flag = r->sig;
  return NULL;
}

/* A Join alone in a world of 2 says every interval that it still waits,
 * and a signal ends it, naming the signal and the job. The signal comes
 * once it said so; its join timeout is an hour, so that an interruption
 * that did not work would fail the test at its timeout. */
START_TEST(join_progress_interrupted)
{
  th_coord_t co;
  FILE *f = tmpfile();
  gs_log_t log = {.level = GS_LOG_INFO, .out = f, .component = "test"};
  raiser_t r = {.log = f, .after = "still waiting for the other ranks", .sig = SIGTERM};
  gs_client_config_t cfg;
  gs_client_t *cl;
  gradsync_JoinRequest req = th_join_request("x", 2, "n0", 0);
  gs_join_result_t res;
  char *text;

  th_coord_start(&co, NULL);
  cfg = client_config(co.rpc_port, "lonely", NULL);
  cfg.log = &log;
  cfg.interrupt = &r.flag;
  cl = gs_client_new(&cfg);
  ck_assert_ptr_nonnull(cl);
  gs_client_set_progress_interval(cl, 200);
  ck_assert_int_eq(pthread_create(&r.thread, NULL, raise_thread, &r), 0);
  ck_assert_int_eq(gs_client_join(cl, &req, 3600000, &res), GS_EINTR);
  ck_assert_int_eq(pthread_join(r.thread, NULL), 0);
  ck_assert_str_eq(gs_client_error(cl),
                   "interrupted by SIGTERM while waiting for the other ranks of job lonely "
                   "(world 2)");
  text = log_text(f);
  ck_assert_msg(strstr(text, "still waiting for the other ranks of job lonely (world 2) after"),
                "log: %s", text);
  free(text);
  /* Leave is the rank's last word: a signal does not end it (its deadline,
   * which it may reach here, decides nothing). */
  ck_assert_int_ne(gs_client_leave(cl, 1, 0, false, "stopped", 2000), GS_EINTR);
  gs_client_free(cl);
  fclose(f);
  ck_assert_int_eq(th_coord_stop(&co), 0);
}
END_TEST

/* With nothing listening, the client says every interval that the
 * coordinator is unreachable, and why; SIGINT (once it said so) ends the
 * redials, which would otherwise go on for the hour of its timeout. */
START_TEST(unreachable_progress_interrupted)
{
  uint16_t port = reserve_port();
  FILE *f = tmpfile();
  gs_log_t log = {.level = GS_LOG_INFO, .out = f, .component = "test"};
  raiser_t r = {.log = f, .after = "), retrying", .sig = SIGINT};
  gs_client_config_t cfg = client_config(port, "void", NULL);
  gs_client_t *cl;
  gradsync_JoinRequest req = th_join_request("x", 1, "n0", 0);
  gs_join_result_t res;
  char want[128], *text;

  cfg.log = &log;
  cfg.interrupt = &r.flag;
  cl = gs_client_new(&cfg);
  ck_assert_ptr_nonnull(cl);
  gs_client_set_progress_interval(cl, 200);
  ck_assert_int_eq(pthread_create(&r.thread, NULL, raise_thread, &r), 0);
  ck_assert_int_eq(gs_client_join(cl, &req, 3600000, &res), GS_EINTR);
  ck_assert_int_eq(pthread_join(r.thread, NULL), 0);
  ck_assert_msg(strstr(gs_client_error(cl), "interrupted by SIGINT while waiting for the other "
                                            "ranks of job void (world 1)"),
                "error: %s", gs_client_error(cl));
  text = log_text(f);
  snprintf(want, sizeof(want),
           "coordinator unreachable at 127.0.0.1:%u (connect 127.0.0.1:%u: ", port, port);
  ck_assert_msg(strstr(text, want), "log: %s", text);
  ck_assert_msg(strstr(text, "), retrying"), "log: %s", text);
  free(text);
  gs_client_free(cl);
  fclose(f);
}
END_TEST

/* A Leave sent while a restarted coordinator does not know the job yet is
 * tried again until the rank's heartbeat has re-registered it; the
 * heartbeat says when it works again after failing. */
START_TEST(leave_after_restart)
{
  uint16_t port = reserve_port();
  char listen[32];
  th_coord_t co;
  FILE *f = tmpfile();
  gs_log_t log = {.level = GS_LOG_INFO, .out = f, .component = "test"};
  gradsync_JoinRequest req = th_join_request("leaver", 1, "n0", 0);
  gs_heartbeat_config_t hc;
  gs_heartbeat_t *hb;
  gs_client_t *cl;
  gs_join_result_t r;
  abort_rec_t rec;
  char *text;

  abort_rec_init(&rec);
  snprintf(listen, sizeof(listen), "127.0.0.1:%u", port);
  th_coord_start(&co, "--listen", listen, NULL);
  cl = new_client(port, "leaver", NULL);
  ck_assert_msg(gs_client_join(cl, &req, TH_WAIT_MS, &r) == 0, "join: %s", gs_client_error(cl));
  hc = (gs_heartbeat_config_t){
      .client = client_config(port, "leaver", NULL),
      .generation = r.generation,
      .session = r.session,
      .interval_ms = 100,
      .timeout_ms = TH_WAIT_MS,
      .on_abort = on_abort,
      .arg = &rec,
      .rejoin = &req,
  };
  hc.client.log = &log;
  hb = gs_heartbeat_start(&hc);
  ck_assert_ptr_nonnull(hb);
  wait_valid(hb, TH_WAIT_MS);
  th_coord_kill(&co);
  ck_assert_msg(wait_log(f, "heartbeat failed"), "no heartbeat failed while it was down");
  th_coord_start(&co, "--listen", listen, NULL);
  ck_assert_msg(gs_client_leave(cl, r.generation, 0, true, "done", TH_WAIT_MS) == 0, "leave: %s",
                gs_client_error(cl));
  gs_heartbeat_stop(hb);
  text = log_text(f);
  ck_assert_msg(strstr(text, "heartbeats recovered: the coordinator 127.0.0.1:"), "log: %s", text);
  ck_assert_msg(strstr(text, " s without a reply"), "log: %s", text);
  free(text);
  ck_assert_int_eq(rec.count, 0);
  gs_join_result_free(&r);
  gs_client_free(cl);
  fclose(f);
  ck_assert_int_eq(th_coord_stop(&co), 0);
}
END_TEST

static TCase *tcase(const char *name, const TTest *test)
{
  TCase *tc = tcase_create(name);

  tcase_add_test(tc, test);
  tcase_set_timeout(tc, 20);
  return tc;
}

static Suite *client_suite(void)
{
  Suite *s = suite_create("client");

  suite_add_tcase(s, tcase("join_world1", join_world1));
  suite_add_tcase(s, tcase("join_world2_threads", join_world2_threads));
  suite_add_tcase(s, tcase("publish_fetch", publish_fetch));
  suite_add_tcase(s, tcase("packlist_roundtrip", packlist_roundtrip));
  suite_add_tcase(s, tcase("refused_call", refused_call));
  suite_add_tcase(s, tcase("nothing_listening", nothing_listening));
  suite_add_tcase(s, tcase("reconnect", reconnect));
  suite_add_tcase(s, tcase("resend_in_flight", resend_in_flight));
  suite_add_tcase(s, tcase("stale_reply_skipped", stale_reply_skipped));
  suite_add_tcase(s, tcase("token", token));
  suite_add_tcase(s, tcase("heartbeat_directives", heartbeat_directives));
  suite_add_tcase(s, tcase("heartbeat_abort", heartbeat_abort));
  suite_add_tcase(s, tcase("heartbeat_unreachable", heartbeat_unreachable));
  suite_add_tcase(s, tcase("heartbeat_restart_not_abort", heartbeat_restart_not_abort));
  suite_add_tcase(s, tcase("heartbeat_forgone_rejoin", heartbeat_forgone_rejoin));
  suite_add_tcase(s, tcase("heartbeat_stop_latency", heartbeat_stop_latency));
  suite_add_tcase(s, tcase("join_progress_interrupted", join_progress_interrupted));
  suite_add_tcase(s, tcase("unreachable_progress_interrupted", unreachable_progress_interrupted));
  suite_add_tcase(s, tcase("leave_after_restart", leave_after_restart));
  return s;
}

const gs_test_binary_t gs_test_binary = {.suites = {client_suite}};
