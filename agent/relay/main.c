/* gradsync-relay: the node agent's program (see relay.h). Prints
 * "gradsync-relay listening socket=PATH coordinator=HOST:PORT" on stdout
 * once the ranks may connect; stops on SIGTERM or SIGINT. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <uv.h>

#include "flags.h"
#include "log.h"
#include "relay.h"
#include "tls_session.h"

typedef struct args {
  gs_relay_config_t cfg;
  uint64_t window_ms;
  const char *tls_ca, *tls_cert, *tls_key;
  gs_log_t log;
} args_t;

#define ARG(m) GS_FLAG_AT(args_t, m)

/* clang-format off */
static const gs_flag_t flags[] = {
  {.name = "--coordinator", .kind = GS_FLAG_ADDR, ARG(cfg.coord_host),
   GS_FLAG_PORT_AT(args_t, cfg.coord_port), .min = 1, .required = true,
   .env = "GRADSYNC_COORDINATOR", .metavar = "HOST:PORT",
   .help = "the coordinator's RPC address"},
  {.name = "--socket", .kind = GS_FLAG_STRBUF, ARG(cfg.socket_path), .min = 1, .required = true,
   .metavar = "PATH", .help = "the Unix socket the node's ranks connect to (unix:PATH)"},
  {.name = "--ranks", .kind = GS_FLAG_INT, ARG(cfg.ranks), .min = 1, .max = 255, .metavar = "N",
   .help = "ranks on this node: a batch of Joins or heartbeats goes up once all N are in"},
  {.name = "--window", .kind = GS_FLAG_DURATION, ARG(window_ms), .umin = 1, .umax = 10000,
   .metavar = "DUR", .help = "or this long after the first call of a batch"},
  {.name = "--tls-ca", .kind = GS_FLAG_STR, ARG(tls_ca), .min = 1, .env = "GRADSYNC_TLS_CA",
   .metavar = "FILE", .def = "`$GRADSYNC_TLS_CA`; none: plaintext",
   .help = "speak TLS to the coordinator, verifying its certificate with this CA (PEM)"},
  {.name = "--tls-cert", .kind = GS_FLAG_STR, ARG(tls_cert), .min = 1,
   .env = "GRADSYNC_TLS_CERT", .metavar = "FILE", .def = "`$GRADSYNC_TLS_CERT`",
   .help = "this node's certificate (PEM), for a coordinator with --tls-client-ca"},
  {.name = "--tls-key", .kind = GS_FLAG_STR, ARG(tls_key), .min = 1, .env = "GRADSYNC_TLS_KEY",
   .metavar = "FILE", .def = "`$GRADSYNC_TLS_KEY`", .help = "the private key of --tls-cert (PEM)"},
  {.name = "--log-level", .kind = GS_FLAG_CUSTOM, ARG(log.level),
   .parse = gs_log_level_flag_parse, .show = gs_log_level_flag_show,
   .metavar = "LEVEL", .help = "error, warn, info or debug"},
};
/* clang-format on */

/* What a stop signal, or a failure the relay cannot get past, ends. */
typedef struct app {
  uv_signal_t term, intr;
  gs_relay_t *relay;
  const gs_log_t *log;
  int status;
} app_t;

static void stop(app_t *app)
{
  gs_relay_stop(app->relay);
  if (!uv_is_closing((uv_handle_t *)&app->term)) {
    uv_close((uv_handle_t *)&app->term, NULL);
    uv_close((uv_handle_t *)&app->intr, NULL);
  }
}

static void on_signal(uv_signal_t *h, int signum)
{
  app_t *app = h->data;

  gs_log(app->log, GS_LOG_INFO, NULL, -1, "relay: %s: stopping",
         signum == SIGTERM ? "SIGTERM" : "SIGINT");
  stop(app);
}

/* The coordinator's TLS refused (a restart would be refused alike). */
static void on_fatal(void *ctx, const char *why)
{
  app_t *app = ctx;

  fprintf(stderr, "gradsync-relay: %s\n", why);
  app->status = GS_RELAY_EXIT_FATAL;
  stop(app);
}

int main(int argc, char **argv)
{
  static const gs_flags_t spec = {
      .prog = "gradsync-relay",
      .usage = "usage: gradsync-relay --coordinator HOST:PORT --socket PATH [--ranks N]\n"
               "\n"
               "The node agent: the ranks of this node connect to it on a Unix socket\n"
               "(--coordinator unix:PATH) and it speaks for them all to the coordinator on\n"
               "one connection, their Joins and heartbeats batched into one frame each.\n"
               "gradsync-run --node-agent starts it.\n",
      .flags = flags,
      .count = sizeof(flags) / sizeof(flags[0]),
  };
  args_t a = {.cfg = {.ranks = 1}, .window_ms = 20, .log = {GS_LOG_INFO, NULL, "relay"}};
  gs_flags_opts_t opts = {.getenv = getenv};
  app_t app = {.log = &a.log};
  struct ssl_ctx_st *tls = NULL;
  uv_loop_t loop;
  char why[512];
  int rc = gs_flags_main(&spec, &a, argc, argv, &opts, GS_VERSION);

  if (rc)
    return rc < 0 ? 0 : rc;
  a.cfg.window_ms = (uint32_t)a.window_ms;
  a.cfg.log = &a.log;
  if (a.tls_ca || a.tls_cert || a.tls_key) {
    tls = gs_tls_client_ctx_new(a.tls_ca, a.tls_cert, a.tls_key, why, sizeof(why));
    if (!tls) {
      fprintf(stderr, "gradsync-relay: %s\n", why);
      return 2;
    }
  }
  a.cfg.tls = tls;
  a.cfg.on_fatal = on_fatal;
  a.cfg.fatal_ctx = &app;
  signal(SIGPIPE, SIG_IGN);
  uv_loop_init(&loop);
  app.relay = gs_relay_start(&loop, &a.cfg, why, sizeof(why));
  if (!app.relay) {
    fprintf(stderr, "gradsync-relay: %s\n", why);
    uv_loop_close(&loop);
    gs_tls_client_ctx_free(tls);
    return 1;
  }
  uv_signal_init(&loop, &app.term);
  uv_signal_init(&loop, &app.intr);
  app.term.data = app.intr.data = &app;
  uv_signal_start(&app.term, on_signal, SIGTERM);
  uv_signal_start(&app.intr, on_signal, SIGINT);
  printf("gradsync-relay listening socket=%s coordinator=%s:%u%s\n", a.cfg.socket_path,
         a.cfg.coord_host, a.cfg.coord_port, tls ? " tls" : "");
  fflush(stdout);
  uv_run(&loop, UV_RUN_DEFAULT);
  uv_loop_close(&loop);
  gs_tls_client_ctx_free(tls);
  return app.status;
}
