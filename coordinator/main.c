/* gradsync-coordinator: flags, signals, and the loop. */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "coordinator.h"
#include "frame.h"
#include "parse.h"

static void usage(FILE *out)
{
  fprintf(out,
          "usage: gradsync-coordinator [options]\n"
          "\n"
          "The gradsync control plane: rendezvous of a job's agents, the parameter pack list,\n"
          "heartbeats and directives over RPC; status and control over HTTP.\n"
          "\n"
          "  --listen HOST:PORT          RPC address (default :7070; port 0 picks a free one)\n"
          "  --http HOST:PORT            HTTP address (default :8080)\n"
          "  --token TOKEN               shared secret agents and control requests must send\n"
          "                              (default: $GRADSYNC_TOKEN; none when unset)\n"
          "  --heartbeat-interval DUR    how often agents send heartbeats (default 1s)\n"
          "  --heartbeat-timeout DUR     silence after which a rank is lost (default 10s)\n"
          "  --rendezvous-timeout DUR    how long a rendezvous waits for all agents (default 5m)\n"
          "  --idle-timeout DUR          close connections idle this long (default 60s)\n"
          "  --wait-timeout DUR          default deadline of Fetch/FetchPackList (default 60s)\n"
          "  --job-retention DUR         forget a finished job this long after it finished\n"
          "                              (default 1h; its status stays readable until then)\n"
          "  --max-frame SIZE            largest RPC frame accepted (default 4MiB)\n"
          "  --max-world-size N          largest world size accepted (default 65536)\n"
          "  --log-level LEVEL           error, warn, info or debug (default info)\n"
          "  --version                   print the version and exit\n"
          "  -h, --help                  print this help and exit\n"
          "\n"
          "On start it prints one line to stdout:\n"
          "  gradsync-coordinator listening rpc=HOST:PORT http=HOST:PORT\n"
          "Durations take a unit (250ms, 5s, 2m, 1h); sizes take B, KiB, MiB, GiB.\n");
}

enum {
  OPT_LISTEN = 256,
  OPT_HTTP,
  OPT_TOKEN,
  OPT_HB_INTERVAL,
  OPT_HB_TIMEOUT,
  OPT_RDV_TIMEOUT,
  OPT_IDLE_TIMEOUT,
  OPT_WAIT_TIMEOUT,
  OPT_JOB_RETENTION,
  OPT_MAX_FRAME,
  OPT_MAX_WORLD,
  OPT_LOG_LEVEL,
  OPT_VERSION,
};

static const struct option options[] = {
    {"listen", required_argument, NULL, OPT_LISTEN},
    {"http", required_argument, NULL, OPT_HTTP},
    {"token", required_argument, NULL, OPT_TOKEN},
    {"heartbeat-interval", required_argument, NULL, OPT_HB_INTERVAL},
    {"heartbeat-timeout", required_argument, NULL, OPT_HB_TIMEOUT},
    {"rendezvous-timeout", required_argument, NULL, OPT_RDV_TIMEOUT},
    {"idle-timeout", required_argument, NULL, OPT_IDLE_TIMEOUT},
    {"wait-timeout", required_argument, NULL, OPT_WAIT_TIMEOUT},
    {"job-retention", required_argument, NULL, OPT_JOB_RETENTION},
    {"max-frame", required_argument, NULL, OPT_MAX_FRAME},
    {"max-world-size", required_argument, NULL, OPT_MAX_WORLD},
    {"log-level", required_argument, NULL, OPT_LOG_LEVEL},
    {"version", no_argument, NULL, OPT_VERSION},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

static int bad_value(const char *flag, const char *value, const char *expect)
{
  fprintf(stderr, "gradsync-coordinator: invalid value '%s' for --%s: expected %s\n", value, flag,
          expect);
  return 2;
}

static int duration_flag(const char *flag, const char *v, uint64_t *ms)
{
  if (gs_parse_duration_ms(v, ms) || *ms == 0)
    return bad_value(flag, v, "a positive duration such as 250ms, 10s or 5m");
  return 0;
}

/* Parses argv into cfg; returns 0 to run, or an exit status (-1: exit 0). */
static int parse_flags(int argc, char **argv, gs_coord_config_t *cfg)
{
  const char *env_token = getenv("GRADSYNC_TOKEN");
  uint64_t size;
  long n;
  int opt, err = 0;

  if (env_token)
    snprintf(cfg->token, sizeof(cfg->token), "%s", env_token);
  while (!err && (opt = getopt_long(argc, argv, "h", options, NULL)) != -1) {
    const char *name = opt >= OPT_LISTEN ? options[opt - OPT_LISTEN].name : "";

    switch (opt) {
    case OPT_LISTEN:
      if (gs_parse_addr(optarg, cfg->rpc_host, sizeof(cfg->rpc_host), &cfg->rpc_port))
        err = bad_value(name, optarg, "HOST:PORT or :PORT");
      break;
    case OPT_HTTP:
      if (gs_parse_addr(optarg, cfg->http_host, sizeof(cfg->http_host), &cfg->http_port))
        err = bad_value(name, optarg, "HOST:PORT or :PORT");
      break;
    case OPT_TOKEN:
      if (strlen(optarg) >= sizeof(cfg->token))
        err = bad_value(name, "(hidden)", "at most 255 bytes");
      snprintf(cfg->token, sizeof(cfg->token), "%s", optarg);
      break;
    case OPT_HB_INTERVAL:
      err = duration_flag(name, optarg, &cfg->heartbeat_interval_ms);
      break;
    case OPT_HB_TIMEOUT:
      err = duration_flag(name, optarg, &cfg->heartbeat_timeout_ms);
      break;
    case OPT_RDV_TIMEOUT:
      err = duration_flag(name, optarg, &cfg->rendezvous_timeout_ms);
      break;
    case OPT_IDLE_TIMEOUT:
      err = duration_flag(name, optarg, &cfg->idle_timeout_ms);
      break;
    case OPT_WAIT_TIMEOUT:
      err = duration_flag(name, optarg, &cfg->default_wait_ms);
      break;
    case OPT_JOB_RETENTION:
      err = duration_flag(name, optarg, &cfg->job_retention_ms);
      break;
    case OPT_MAX_FRAME:
      if (gs_parse_size(optarg, &size) || size < 1024 || size > (1u << 30))
        err = bad_value(name, optarg, "a size from 1KiB to 1GiB");
      cfg->max_frame = size;
      break;
    case OPT_MAX_WORLD:
      if (gs_parse_long(optarg, 1, 1 << 24, &n))
        err = bad_value(name, optarg, "an integer from 1 to 16777216");
      cfg->max_world_size = (uint32_t)n;
      break;
    case OPT_LOG_LEVEL:
      if (gs_log_level_parse(optarg, &cfg->log.level))
        err = bad_value(name, optarg, "error, warn, info or debug");
      break;
    case OPT_VERSION:
      printf("gradsync-coordinator %s\n", GS_VERSION);
      return -1;
    case 'h':
      usage(stdout);
      return -1;
    default:
      fprintf(stderr, "Try 'gradsync-coordinator --help'.\n");
      return 2;
    }
  }
  if (!err && optind < argc) {
    fprintf(stderr, "gradsync-coordinator: unexpected argument '%s'\n", argv[optind]);
    err = 2;
  }
  if (!err && cfg->heartbeat_timeout_ms <= cfg->heartbeat_interval_ms) {
    fprintf(stderr, "gradsync-coordinator: --heartbeat-timeout must exceed --heartbeat-interval\n");
    err = 2;
  }
  return err;
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

int main(int argc, char **argv)
{
  gs_coord_config_t cfg;
  uv_loop_t loop;
  app_t app;
  int rc;

  gs_coord_config_defaults(&cfg);
  rc = parse_flags(argc, argv, &cfg);
  if (rc)
    return rc < 0 ? 0 : rc;
  signal(SIGPIPE, SIG_IGN);
  raise_fd_limit(&cfg);
  uv_loop_init(&loop);
  app.log = &cfg.log;
  app.coord = gs_coord_new(&loop, &cfg);
  if (!app.coord)
    return 1;
  if (gs_coord_start(app.coord)) {
    gs_coord_close(app.coord);
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);
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
  gs_log(&cfg.log, GS_LOG_INFO, NULL, -1, "listening rpc=%s:%u http=%s:%u%s", cfg.rpc_host,
         gs_coord_rpc_port(app.coord), cfg.http_host, gs_coord_http_port(app.coord),
         cfg.token[0] ? " (token required)" : "");
  uv_run(&loop, UV_RUN_DEFAULT);
  rc = uv_loop_close(&loop);
  gs_log(&cfg.log, GS_LOG_INFO, NULL, -1, "stopped");
  return rc ? 1 : 0;
}
