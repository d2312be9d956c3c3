/* gradsync-coordinator: flags, signals, and the loop. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "auth.h"
#include "coord_flags.h"
#include "coordinator.h"
#include "fd_budget.h"
#include "http_routes.h"
#include "flags.h"
#include "frame.h"
#include "parse.h"

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
  /* A warning, not a refusal: the certificate may be renewed in place
   * (the next restart loads it), and a test CA may be short-lived. */
  if (gs__tls_ctx_cert_warning(cfg->tls, cfg->tls_cert, why, sizeof(why)))
    gs_log(&cfg->log, GS_LOG_WARN, NULL, -1, "%s", why);
  return 0;
}

/* Parses argv into cfg, which holds the defaults; returns 0 to run, or an
 * exit status (-1: exit 0). */
static int parse_flags(int argc, char **argv, gs_coord_config_t *cfg)
{
  gs_flags_opts_t opts = {.getenv = getenv};
  int rc = gs_flags_main(gs_coord_flags(), cfg, argc, argv, &opts, GS_VERSION);

  if (rc)
    return rc;
  if (cfg->heartbeat_timeout_ms <= cfg->heartbeat_interval_ms) {
    fprintf(stderr, "gradsync-coordinator: --heartbeat-timeout must exceed --heartbeat-interval\n");
    return 2;
  }
  return tls_from_flags(cfg);
}

#define FD_HEADROOM 64 /* descriptors besides agent connections: listeners, HTTP, stdio */

/* Every agent connected directly holds a connection (a node agent one for
 * its node), so the open-file limit caps how many can join: raise the soft
 * limit to the hard one, and say so when even that is short of
 * --max-world-size. */
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
  if (rl.rlim_cur < want) {
    gs_fd_budget_t b = gs__fd_budget(rl.rlim_cur, cfg->max_connections, cfg->max_http_connections);
    uint64_t room = rl.rlim_cur > GS_FD_OTHERS + b.http ? rl.rlim_cur - GS_FD_OTHERS - b.http : 0;

    gs_log(&cfg->log, GS_LOG_INFO, NULL, -1,
           "open-file limit is %llu: about %llu agents can connect directly, fewer than "
           "--max-world-size %u; raise the hard limit (ulimit -Hn, systemd LimitNOFILE=, docker "
           "--ulimit nofile=) for jobs that large, or run node agents (gradsync-run "
           "--node-agent: one connection per node)",
           (unsigned long long)rl.rlim_cur,
           (unsigned long long)(b.fits || b.rpc < room ? b.rpc : room), cfg->max_world_size);
  } else
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
