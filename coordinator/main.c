/* gradsync-coordinator: flags, signals, and the loop. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "auth.h"
#include "coordinator.h"
#include "http_routes.h"
#include "flags.h"
#include "frame.h"
#include "parse.h"

/* The flags: one row each (common/flags.h); --help and the flag reference
 * are made from these rows and the defaults gs_coord_config_defaults sets.
 * Kept out of clang-format so each flag stays one block of a few lines. */
#define CFG(member) GS_FLAG_AT(gs_coord_config_t, member)
static const char *const http_auth_names[] = {"control", "read", "none", NULL};
_Static_assert(GS_HTTP_AUTH_CONTROL == 0 && GS_HTTP_AUTH_READ == 1 && GS_HTTP_AUTH_NONE == 2,
               "http_auth_names follows gs_http_auth_t");
/* clang-format off */
static const gs_flag_t flag_rows[] = {
  {.name = "--listen", .kind = GS_FLAG_ADDR, CFG(rpc_host),
   GS_FLAG_PORT_AT(gs_coord_config_t, rpc_port), .metavar = "HOST:PORT",
   .help = "RPC address (port 0 picks a free one)",
   .doc = "RPC address (agents); `:PORT` is every interface, port 0 any free port"},
  {.name = "--http", .kind = GS_FLAG_ADDR, CFG(http_host),
   GS_FLAG_PORT_AT(gs_coord_config_t, http_port), .metavar = "HOST:PORT",
   .help = "HTTP address", .doc = "HTTP address (people, tools)"},
  {.name = "--token", .kind = GS_FLAG_STRBUF, CFG(token), .secret = true, .env = "GRADSYNC_TOKEN",
   .metavar = "TOKEN", .def = "`$GRADSYNC_TOKEN`",
   .help = "shared secret agents and control requests must send (none when empty)",
   .doc = "shared secret for every RPC and for control requests; none when empty. Prefer the "
          "environment variable: flags show in `ps`"},
  {.name = "--tls-cert", .kind = GS_FLAG_STR, CFG(tls_cert), .min = 1, .env = "GRADSYNC_TLS_SERVER_CERT",
   .metavar = "FILE", .def = "`$GRADSYNC_TLS_SERVER_CERT`",
   .help = "TLS on both ports: this certificate (PEM, chain first to last); needs --tls-key",
   .doc = "the RPC and HTTP ports speak only TLS, with this certificate (PEM; the server's "
          "first, then any intermediates); with `--tls-key`. Agents then need `--tls-ca`"},
  {.name = "--tls-key", .kind = GS_FLAG_STR, CFG(tls_key), .min = 1, .env = "GRADSYNC_TLS_SERVER_KEY",
   .metavar = "FILE", .def = "`$GRADSYNC_TLS_SERVER_KEY`", .help = "the private key of --tls-cert (PEM)",
   .doc = "the private key of `--tls-cert` (PEM); checked against it at start"},
  {.name = "--tls-client-ca", .kind = GS_FLAG_STR, CFG(tls_client_ca), .min = 1,
   .env = "GRADSYNC_TLS_CLIENT_CA", .metavar = "FILE", .def = "`$GRADSYNC_TLS_CLIENT_CA`",
   .help = "mutual TLS: RPC clients must present a certificate signed by this CA (PEM)",
   .doc = "mutual TLS: RPC clients (agents) must present a certificate this CA signed "
          "(`--tls-cert`/`--tls-key` on the agent); the HTTP port asks for none"},
  {.name = "--http-auth", .kind = GS_FLAG_ENUM, CFG(http_auth), .names = http_auth_names,
   .help = "with a token, what HTTP needs it for: control, read or none",
   .doc = "with a token set, what HTTP requests need it (or the job's token, for that job): "
          "`control` (control requests, and `/jobs/NAME` and `?ranks=1`, which show ranks' "
          "addresses), `read` (everything but `/healthz`), `none`"},
  {.name = "--heartbeat-interval", .kind = GS_FLAG_DURATION, CFG(heartbeat_interval_ms),
   .umin = 1, .metavar = "DUR", .help = "how often agents send heartbeats",
   .doc = "how often agents heartbeat (sent to them at Join)"},
  {.name = "--heartbeat-timeout", .kind = GS_FLAG_DURATION, CFG(heartbeat_timeout_ms),
   .umin = 1, .metavar = "DUR", .help = "silence after which a rank is lost",
   .doc = "silence after which a rank is lost and its generation aborted"},
  {.name = "--rendezvous-timeout", .kind = GS_FLAG_DURATION, CFG(rendezvous_timeout_ms),
   .umin = 1, .metavar = "DUR", .help = "how long a rendezvous waits for all agents",
   .doc = "how long a rendezvous waits for its world, from its first Join"},
  {.name = "--idle-timeout", .kind = GS_FLAG_DURATION, CFG(idle_timeout_ms), .umin = 1,
   .metavar = "DUR", .help = "close connections idle this long",
   .doc = "connections (RPC and HTTP) with nothing to do this long are closed"},
  {.name = "--wait-timeout", .kind = GS_FLAG_DURATION, CFG(default_wait_ms), .umin = 1,
   .metavar = "DUR", .help = "default deadline of Fetch/FetchPackList",
   .doc = "deadline of `Fetch`/`FetchPackList` that set none"},
  {.name = "--job-retention", .kind = GS_FLAG_DURATION, CFG(job_retention_ms), .umin = 1,
   .metavar = "DUR",
   .help = "forget a finished or abandoned job this long after it came to rest (its status "
           "stays readable until then)",
   .doc = "a job with nothing in progress (finished, failed and not rejoined, or a rendezvous "
          "that timed out) stays in the status this long, then is forgotten; a job of that "
          "name may start again at any time"},
  {.name = "--stall-timeout", .kind = GS_FLAG_DURATION, CFG(stall_timeout_ms),
   .metavar = "DUR",
   .help = "flag a job stalled when its step has not advanced this long (0s: never)",
   .doc = "a running job whose step has not advanced this long while its heartbeats are fresh "
          "is flagged `stalled` in `/status` and `/metrics`, with the ranks that lag; `0s` "
          "disables"},
  {.name = "--max-frame", .kind = GS_FLAG_SIZE, CFG(max_frame), .umin = 1024, .umax = 1u << 30,
   .metavar = "SIZE", .help = "largest RPC frame accepted",
   .doc = "largest RPC frame; a larger one gets an error and the connection is closed"},
  {.name = "--max-memory", .kind = GS_FLAG_SIZE, CFG(max_memory), .umin = 1u << 20,
   .metavar = "SIZE", .help = "memory all RPC connections' buffers may hold together",
   .doc = "budget for what every RPC connection holds together (partial frames, queued "
          "replies, bookkeeping); past three quarters of it new calls get RESOURCE_EXHAUSTED, "
          "and a connection that would pass it is closed"},
  {.name = "--max-connections", .kind = GS_FLAG_INT, CFG(max_connections), .min = 0,
   .max = 1 << 20, .metavar = "N",
   .help = "open RPC connections at most (0: the open-file limit less 256)",
   .doc = "open RPC connections at most; at the limit the oldest idle connection that never "
          "authenticated is closed, else the new one is refused (logged). `0`: the open-file "
          "limit less 256 descriptors kept for the HTTP port"},
  {.name = "--max-params", .kind = GS_FLAG_INT, CFG(max_params), .min = 1, .max = 1 << 24,
   .metavar = "N", .help = "largest pack list (model tensors) accepted",
   .doc = "entries of a published pack list (a model's tensors) at most; each costs about "
          "300 bytes to decode, and a larger list is refused before it is stored"},
  {.name = "--max-world-size", .kind = GS_FLAG_INT, CFG(max_world_size), .min = 1,
   .max = 1 << 24, .metavar = "N", .help = "largest world size accepted"},
  {.name = "--log-level", .kind = GS_FLAG_CUSTOM, CFG(log.level),
   .parse = gs_log_level_flag_parse, .show = gs_log_level_flag_show,
   .metavar = "LEVEL", .help = "error, warn, info or debug",
   .doc = "`error`, `warn`, `info` or `debug`"},
};
/* clang-format on */

static const gs_flags_t flags = {
    .prog = "gradsync-coordinator",
    .usage = "usage: gradsync-coordinator [options]\n"
             "\n"
             "The gradsync control plane: rendezvous of a job's agents, the parameter pack list,\n"
             "heartbeats and directives over RPC; status and control over HTTP.\n"
             "\n",
    .epilog = "On start it prints one line to stdout:\n"
              "  gradsync-coordinator listening rpc=HOST:PORT http=HOST:PORT\n"
              "`gradsync-coordinator token --job NAME` prints job NAME's token: it opens that\n"
              "job (its RPCs, control and status) and nothing else.\n"
              "Durations take a unit (250ms, 5s, 2m, 1h); sizes take B, KiB, MiB, GiB.\n",
    .flags = flag_rows,
    .count = sizeof(flag_rows) / sizeof(flag_rows[0]),
};

/* Makes the TLS context of the --tls-* flags, checking their files now
 * rather than at the first connection: 0, or exit status 2 with the
 * reason. The context lives as long as the process. */
static int tls_from_flags(gs_coord_config_t *cfg)
{
  char why[512];

  if (!cfg->tls_cert && !cfg->tls_key && !cfg->tls_client_ca)
    return 0;
  if (!cfg->tls_cert || !cfg->tls_key) {
    fprintf(stderr,
            "gradsync-coordinator: %s needs %s as well (TLS takes a certificate and its "
            "key)\n",
            cfg->tls_cert  ? "--tls-cert"
            : cfg->tls_key ? "--tls-key"
                           : "--tls-client-ca",
            cfg->tls_cert  ? "--tls-key"
            : cfg->tls_key ? "--tls-cert"
                           : "--tls-cert and --tls-key");
    return 2;
  }
  cfg->tls = gs__tls_ctx_new(cfg->tls_cert, cfg->tls_key, cfg->tls_client_ca, why, sizeof(why));
  if (!cfg->tls) {
    fprintf(stderr, "gradsync-coordinator: %s\n", why);
    return 2;
  }
  return 0;
}

/* Parses argv into cfg, which holds the defaults; returns 0 to run, or an
 * exit status (-1: exit 0). */
static int parse_flags(int argc, char **argv, gs_coord_config_t *cfg)
{
  gs_flags_opts_t opts = {.getenv = getenv};
  int rc = gs_flags_main(&flags, cfg, argc, argv, &opts, GS_VERSION);

  if (rc)
    return rc;
  if (cfg->heartbeat_timeout_ms <= cfg->heartbeat_interval_ms) {
    fprintf(stderr, "gradsync-coordinator: --heartbeat-timeout must exceed --heartbeat-interval\n");
    return 2;
  }
  return tls_from_flags(cfg);
}

#define FD_HEADROOM 64 /* descriptors besides agent connections: listeners, HTTP, stdio */

/* Every agent holds a connection, so the open-file limit caps how many can
 * join: raise the soft limit to the hard one, and say so when even that is
 * short of --max-world-size. */
static void raise_fd_limit(const gs_coord_config_t *cfg)
{
  rlim_t want = (rlim_t)cfg->max_world_size + FD_HEADROOM;
  struct rlimit rl;

  if (getrlimit(RLIMIT_NOFILE, &rl)) {
    gs_log(&cfg->log, GS_LOG_WARN, NULL, -1, "getrlimit(RLIMIT_NOFILE): %s", strerror(errno));
    return;
  }
  if (rl.rlim_cur < rl.rlim_max) {
    struct rlimit up = {rl.rlim_max == RLIM_INFINITY ? 1u << 20 : rl.rlim_max, rl.rlim_max};

    if (setrlimit(RLIMIT_NOFILE, &up) == 0)
      rl.rlim_cur = up.rlim_cur;
    else
      gs_log(&cfg->log, GS_LOG_WARN, NULL, -1,
             "cannot raise the open-file limit from %llu to %llu: %s",
             (unsigned long long)rl.rlim_cur, (unsigned long long)up.rlim_cur, strerror(errno));
  }
  /* INFO, not WARN: most machines' hard limit is below the default
   * --max-world-size and most jobs are far smaller; an accept that runs
   * out of descriptors warns on its own. */
  if (rl.rlim_cur < want)
    gs_log(&cfg->log, GS_LOG_INFO, NULL, -1,
           "open-file limit is %llu: about %llu agents can connect, fewer than --max-world-size "
           "%u; raise the hard limit (ulimit -Hn, systemd LimitNOFILE=, docker --ulimit nofile=) "
           "for jobs that large",
           (unsigned long long)rl.rlim_cur,
           (unsigned long long)(rl.rlim_cur > FD_HEADROOM ? rl.rlim_cur - FD_HEADROOM : 0),
           cfg->max_world_size);
  else
    gs_log(&cfg->log, GS_LOG_DEBUG, NULL, -1, "open-file limit is %llu",
           (unsigned long long)rl.rlim_cur);
}

typedef struct app {
  uv_signal_t sigint, sigterm;
  gs_coord_t *coord;
  const gs_log_t *log;
} app_t;

static void on_signal(uv_signal_t *h, int signum)
{
  app_t *app = h->data;

  gs_log(app->log, GS_LOG_INFO, NULL, -1, "%s received; shutting down",
         signum == SIGINT ? "SIGINT" : "SIGTERM");
  gs_coord_close(app->coord);
  uv_close((uv_handle_t *)&app->sigint, NULL);
  uv_close((uv_handle_t *)&app->sigterm, NULL);
}

/* `gradsync-coordinator token --job NAME [--token SECRET]`: prints the
 * job's token under the coordinator's secret ($GRADSYNC_TOKEN). */
typedef struct token_args {
  char secret[256];
  const char *job;
} token_args_t;

#define TOK(member) GS_FLAG_AT(token_args_t, member)
/* clang-format off */
static const gs_flag_t token_rows[] = {
  {.name = "--job", .kind = GS_FLAG_STR, TOK(job), .min = 1, .max = 127, .required = true,
   .metavar = "NAME", .help = "the job the token opens"},
  {.name = "--token", .kind = GS_FLAG_STRBUF, TOK(secret), .secret = true, .env = "GRADSYNC_TOKEN",
   .metavar = "TOKEN", .def = "`$GRADSYNC_TOKEN`", .help = "the coordinator's token"},
};
/* clang-format on */

static int token_command(int argc, char **argv)
{
  static const gs_flags_t spec = {
      .prog = "gradsync-coordinator token",
      .usage = "usage: gradsync-coordinator token --job NAME\n"
               "\n"
               "Prints the token of job NAME under the coordinator's token: agents and\n"
               "control requests of that job may use it instead, and it opens nothing else.\n"
               "\n",
      .flags = token_rows,
      .count = sizeof(token_rows) / sizeof(token_rows[0]),
  };
  gs_flags_opts_t opts = {.getenv = getenv};
  token_args_t a = {0};
  char out[GS_JOB_TOKEN_LEN + 1];
  int rc = gs_flags_main(&spec, &a, argc, argv, &opts, GS_VERSION);

  if (rc)
    return rc < 0 ? 0 : rc;
  if (!a.secret[0]) {
    fprintf(stderr,
            "%s: no coordinator token: set $GRADSYNC_TOKEN (or --token) to the "
            "coordinator's\n",
            spec.prog);
    return 2;
  }
  if (gs__job_token(a.secret, a.job, out)) {
    fprintf(stderr, "%s: cannot compute the token\n", spec.prog);
    return 1;
  }
  printf("%s\n", out);
  return 0;
}

int main(int argc, char **argv)
{
  gs_coord_config_t cfg;
  uv_loop_t loop;
  app_t app;
  int rc;

  if (argc > 1 && !strcmp(argv[1], "token"))
    return token_command(argc - 1, argv + 1);
  gs_coord_config_defaults(&cfg);
  rc = parse_flags(argc, argv, &cfg);
  if (rc)
    return rc < 0 ? 0 : rc;
  signal(SIGPIPE, SIG_IGN);
  raise_fd_limit(&cfg);
  uv_loop_init(&loop);
  app.log = &cfg.log;
  app.coord = gs_coord_new(&loop, &cfg);
  if (!app.coord) {
    gs__tls_ctx_free(cfg.tls);
    return 1;
  }
  if (gs_coord_start(app.coord)) {
    gs_coord_close(app.coord);
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);
    gs__tls_ctx_free(cfg.tls);
    return 1;
  }
  uv_signal_init(&loop, &app.sigint);
  uv_signal_init(&loop, &app.sigterm);
  app.sigint.data = app.sigterm.data = &app;
  uv_signal_start(&app.sigint, on_signal, SIGINT);
  uv_signal_start(&app.sigterm, on_signal, SIGTERM);
  printf("gradsync-coordinator listening rpc=%s:%u http=%s:%u\n", cfg.rpc_host,
         gs_coord_rpc_port(app.coord), cfg.http_host, gs_coord_http_port(app.coord));
  fflush(stdout);
  gs_log(&cfg.log, GS_LOG_INFO, NULL, -1, "listening rpc=%s:%u http=%s:%u%s%s", cfg.rpc_host,
         gs_coord_rpc_port(app.coord), cfg.http_host, gs_coord_http_port(app.coord),
         cfg.token[0] ? " (token required)" : "",
         !cfg.tls            ? ""
         : cfg.tls_client_ca ? " (TLS on both ports; RPC clients need a certificate)"
                             : " (TLS on both ports)");
  uv_run(&loop, UV_RUN_DEFAULT);
  rc = uv_loop_close(&loop);
  gs__tls_ctx_free(cfg.tls);
  gs_log(&cfg.log, GS_LOG_INFO, NULL, -1, "stopped");
  return rc ? 1 : 0;
}
