/* gradsync-coordinator's flags, one table (common/flags.h), and its
 * defaults: the coordinator parses its command line with them, and
 * gradsync-run the coordinator flags it is given for the coordinator it
 * starts, so both accept exactly the same ones. */
#include "coord_flags.h"

#include <stdio.h>
#include <string.h>

#include "frame.h"

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
  {.name = "--loop-pace", .kind = GS_FLAG_DURATION, CFG(loop_pace_ms), .umax = 100,
   .metavar = "DUR", .help = "with 1000+ connections, loop wake-ups at least this far apart (0s: off)",
   .doc = "with 1,000 RPC connections or more, the loop wakes at most once per `DUR` and takes "
          "what came meanwhile together: each wake-up costs the CPU more than the frames it "
          "reads (100,000 ranks' heartbeats through node agents: docs/performance.md). Each "
          "call may wait up to `DUR` longer; `0s` wakes for every event"},
  {.name = "--wait-timeout", .kind = GS_FLAG_DURATION, CFG(default_wait_ms), .umin = 1,
   .metavar = "DUR", .help = "default deadline of Fetch/FetchPackList",
   .doc = "deadline of `Fetch`/`FetchPackList` that set none"},
  {.name = "--job-retention", .kind = GS_FLAG_DURATION, CFG(job_retention_ms), .umin = 1,
   .metavar = "DUR",
   .help = "forget a finished or abandoned job this long after it came to rest (its status "
           "stays readable until then); one that never started goes at once",
   .doc = "a job that ran and has nothing in progress (finished, or failed and not rejoined) "
          "stays in the status this long, then is forgotten; one that never started (its "
          "rendezvous timed out or its agents went) is forgotten at once. A job of that name "
          "may start again at any time"},
  {.name = "--stall-timeout", .kind = GS_FLAG_DURATION, CFG(stall_timeout_ms),
   .metavar = "DUR",
   .help = "flag a job stalled when its step has not advanced this long (0s: never)",
   .doc = "a running job whose step has not advanced this long while its heartbeats are fresh "
          "is flagged `stalled` in `/status` and `/metrics`, with the ranks that lag; `0s` "
          "disables"},
  {.name = "--reregister-slack", .kind = GS_FLAG_DURATION, CFG(reregister_slack_ms), .umin = 1,
   .metavar = "DUR",
   .help = "after a restart, how long past the heartbeat timeout a running job's ranks have "
           "to re-register",
   .doc = "a restarted coordinator adopts the running generations its agents re-register "
          "for; a rank that has not re-registered within the heartbeat timeout and this much "
          "more is lost. Agents redial with a backoff of up to about 6 s: less than that may "
          "lose live ranks"},
  {.name = "--max-frame", .kind = GS_FLAG_SIZE, CFG(max_frame), .umin = 1024, .umax = 1u << 30,
   .metavar = "SIZE", .help = "largest RPC frame accepted",
   .doc = "largest RPC frame; a larger one gets an error and the connection is closed"},
  {.name = "--max-memory", .kind = GS_FLAG_SIZE, CFG(max_memory), .umin = 1u << 20,
   .metavar = "SIZE",
   .help = "memory the coordinator may hold for clients: connection buffers, HTTP replies, "
           "blobs, pack lists, ranks",
   .doc = "budget for everything the coordinator holds for clients: what every RPC connection "
          "holds (partial frames, queued replies, bookkeeping), the HTTP replies waiting to be "
          "written (each HTTP connection is held at its share), the jobs' blobs and pack "
          "lists, which may take a quarter of it (a `Publish` or `PublishPackList` past that "
          "gets RESOURCE_EXHAUSTED until generations end), and their ranks and parked Joins, "
          "another quarter (about 1.5 KB each; a Join past it gets RESOURCE_EXHAUSTED); "
          "connections not yet authenticated share another quarter; past three quarters of "
          "the rest new calls get RESOURCE_EXHAUSTED, and a connection that would pass it is "
          "closed"},
  {.name = "--max-connections", .kind = GS_FLAG_INT, CFG(max_connections), .min = 0,
   .max = 1 << 20, .metavar = "N",
   .help = "open RPC connections at most (0: the open-file limit less the HTTP cap and 32)",
   .doc = "open RPC connections at most; at the limit the oldest idle connection that never "
          "authenticated is closed, else the new one is refused (logged). `0`: the open-file "
          "limit less `--max-http-connections` and 32 descriptors for the rest"},
  {.name = "--vacant-idle", .kind = GS_FLAG_DURATION, CFG(vacant_idle_ms), .umin = 1,
   .metavar = "DUR",
   .help = "at --max-connections, close a connection idle this long that holds no rank",
   .doc = "at `--max-connections` with no unauthenticated connection to close, the oldest "
          "authenticated connection that holds no rank (a client's spare one, or one left "
          "open after a refusal) and has been idle this long is closed to admit a new one"},
  {.name = "--max-http-connections", .kind = GS_FLAG_INT, CFG(max_http_connections), .min = 0,
   .max = 1 << 20, .metavar = "N",
   .help = "open HTTP connections at most (0: an eighth of the open-file limit, at most 256)",
   .doc = "open HTTP connections at most; at the limit the one idle longest is closed to admit "
          "a new one (else the one furthest behind on its replies, else the one whose request "
          "began first; logged), so `/healthz` always "
          "answers. `0`: an eighth of the open-file limit, at most 256"},
  {.name = "--max-params", .kind = GS_FLAG_INT, CFG(max_params), .min = 1, .max = 1 << 24,
   .metavar = "N", .help = "largest pack list (model tensors) accepted",
   .doc = "entries of a published pack list (a model's tensors) at most; each costs about "
          "300 bytes to decode, and a larger list is refused before it is stored"},
  {.name = "--max-world-size", .kind = GS_FLAG_INT, CFG(max_world_size), .min = 1,
   .max = 1 << 24, .metavar = "N", .help = "largest world size accepted"},
  {.name = "--max-jobs", .kind = GS_FLAG_INT, CFG(max_jobs), .min = 1, .max = 1 << 24,
   .metavar = "N",
   .help = "jobs held at once; at the cap the job at rest longest makes room, else a Join that "
           "would create one more is refused",
   .doc = "jobs held at once (waiting, running, or at rest until `--job-retention`); at the cap "
          "the job at rest longest is forgotten to make room for a new one, and only with "
          "every job at work is a Join that would create one more refused with "
          "`RESOURCE_EXHAUSTED` (the jobs held go on)"},
  {.name = "--log-level", .kind = GS_FLAG_CUSTOM, CFG(log.level),
   .parse = gs_log_level_flag_parse, .show = gs_log_level_flag_show,
   .metavar = "LEVEL", .help = "error, warn, info or debug",
   .doc = "`error`, `warn`, `info` or `debug`"},
  {.name = "--log-window", .kind = GS_FLAG_DURATION, CFG(log_window_ms), .umin = 1000,
   .umax = 3600000, .metavar = "DUR",
   .help = "lines about clients: 5 per address and kind, 50 in all, per window this long; "
           "the rest counted in a summary at its end",
   .doc = "lines about clients (a wrong token, a bad frame or request, a client over a limit) "
          "are limited per window this long, from its first line: 5 per peer address and kind "
          "of line, 50 for all clients together; what is held back is counted in one summary "
          "line when the window ends (docs/guide/security.md). Whole seconds in the summaries"},
};
/* clang-format on */

static const gs_flags_t spec = {
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

const gs_flags_t *gs_coord_flags(void)
{
  return &spec;
}

void gs_coord_config_defaults(gs_coord_config_t *cfg)
{
  memset(cfg, 0, sizeof(*cfg));
  snprintf(cfg->rpc_host, sizeof(cfg->rpc_host), "0.0.0.0");
  cfg->rpc_port = 7070;
  snprintf(cfg->http_host, sizeof(cfg->http_host), "0.0.0.0");
  cfg->http_port = 8080;
  cfg->heartbeat_interval_ms = 1000;
  cfg->heartbeat_timeout_ms = 10000;
  cfg->rendezvous_timeout_ms = 300000;
  cfg->idle_timeout_ms = 60000;
  cfg->vacant_idle_ms = 10000; /* GS_CONN_VACANT_EVICT_IDLE_MS */
  cfg->loop_pace_ms = 2;
  cfg->log_window_ms = 10000; /* GS_LOG_LIMIT_WINDOW_MS */
  cfg->default_wait_ms = 60000;
  cfg->job_retention_ms = 3600000;
  cfg->stall_timeout_ms = 300000;
  cfg->reregister_slack_ms = 15000; /* GS_REREGISTER_SLACK_MS */
  cfg->max_frame = GS_FRAME_DEFAULT_MAX;
  cfg->max_world_size = 65536;
  cfg->max_jobs = GS_COORD_DEFAULT_MAX_JOBS;
  cfg->max_memory = (size_t)1 << 30;
  cfg->max_connections = 0;      /* from the open-file limit, at start */
  cfg->max_http_connections = 0; /* likewise */
  cfg->max_params = GS_COORD_DEFAULT_MAX_PARAMS;
  cfg->log.level = GS_LOG_INFO;
  cfg->log.component = "coordinator";
}
