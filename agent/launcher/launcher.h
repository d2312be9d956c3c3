/* gradsync-run's internals, shared by the files of agent/launcher/. Layers,
 * from the bottom: say.c (messages), lines.c (pure line splitting),
 * stream.c (pipes), spawn.c (processes), stop.c (stopping in order),
 * restart.c (restarting a failed rank, --max-restarts), supervise.c
 * (starting agents, reaping, forwarding lines; devices.c, the line about
 * the ranks' device; node_agent.c, the node agent the ranks may go
 * through), loop.c (the poll loop),
 * coord_args.c (the coordinator's flags it hands on), options.c (flags)
 * and main.c. Each calls only downward; a
 * stream reports its lines upward through the callback its owner set. */
#ifndef GS_RUN_LAUNCHER_H
#define GS_RUN_LAUNCHER_H

#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/resource.h>
#include <sys/types.h>

#include "launch_env.h"
#include "lines.h"

#define GS_RUN_MAX_NPROC 1024
#define GS_RUN_MAX_NNODES 65536
#define GS_RUN_MAX_WORLD 65536 /* gradsync-agent's --world-size limit */
#define GS_RUN_READY_MS 10000  /* how long the coordinator has to print its address */
#define GS_RUN_DRAIN_MS 1000   /* how long a reaped child's pipes get to reach EOF */
#define GS_RUN_TOKEN_MAX 255   /* the coordinator's limit */
#define GS_RUN_MAX_RESTARTS 1000000
/* A rank's restart waits this long, doubling with each restart of its slot
 * up to the cap, so that a crash loop does not spin; a run that lasted
 * past the cap starts the doubling over. */
#define GS_RUN_BACKOFF_MS 1000
#define GS_RUN_BACKOFF_MAX_MS 30000
#define GS_RUN_USAGE_ERR 2
#define GS_RUN_MAX_COORD_ARGS 256 /* arguments for the coordinator it starts */
/* gs_run_child_t.rank of the children that are no rank. */
#define GS_RUN_COORD_RANK (-1)
#define GS_RUN_NODE_AGENT_RANK (-2)

typedef struct gs_run_stream gs_run_stream_t;

/* Called with each line (without '\n') a stream reads. */
typedef void (*gs_run_line_fn)(gs_run_stream_t *s, const char *line, size_t len);

/* One pipe from a child. */
struct gs_run_stream {
  int fd;     /* read end; -1 once closed */
  int out_fd; /* where its lines go: 1 (stdout) or 2 (stderr) */
  gs_run_line_fn on_line;
  void *data; /* the owner's (the child) */
  gs_run_lines_t lines;
};

typedef struct gs_run gs_run_t;

typedef struct gs_run_child {
  gs_run_t *run;
  pid_t pid;     /* also its process group id */
  bool running;  /* started and not yet reaped */
  int rank;      /* -1 for the coordinator */
  char name[24]; /* "rank 1", "local rank 1" (joining) or "coordinator", for messages */
  char prefix[32];
  uint64_t started;        /* ms: when its process started */
  uint64_t drain_deadline; /* once reaped: when its pipes get closed */
  /* --max-restarts, per local-rank slot: restarts used, the wait before
   * the next, and when a pending one is due (0: none pending). */
  long restarts;
  uint64_t backoff_ms, restart_at;
  gs_run_stream_t out, err;
} gs_run_child_t;

typedef struct gs_run_config {
  long nproc; /* agents on this node (--nproc, --nproc-per-node) */
  long nnodes, node_rank;
  long world; /* nnodes × nproc */
  /* Join mode (--coordinator given): the coordinator runs elsewhere and
   * gradsync-run starts only this node's agents. */
  bool join, have_nnodes, have_node_rank, have_http, print_config;
  char coord_host[256];
  uint16_t coord_port;
  char rpc[300];    /* the coordinator's RPC address handed to the agents */
  const char *node; /* --node for the agents, or NULL: their default */
  /* The first pass-through argument is a program, not a flag: run it
   * (searched in $PATH) with the environment only, instead of agents. */
  bool command;
  const char *job;
  char http_host[256];
  uint16_t http_port;
  char *token; /* --token, or NULL: children inherit $GRADSYNC_TOKEN */
  uint64_t grace_ms;
  long max_restarts;                   /* per local rank; 0: the first failure stops the run */
  long min_ranks;                      /* elastic: the fewest ranks the job runs with; 0: fixed */
  char grace_text[32];                 /* grace_ms as a duration, for messages */
  const char *coord_flag, *agent_flag; /* --coordinator-bin / --agent-bin, or NULL */
  char coord_bin[PATH_MAX];
  char agent_bin[PATH_MAX];
  /* --node-agent: the ranks reach the coordinator through a node agent
   * (gradsync-relay, --relay-bin) on a Unix socket, one connection for all. */
  bool node_agent;
  long node_agent_restarts; /* --node-agent-restarts: how often a dead one is started again */
  /* The agents' TLS flags, with their values, moved to the node agent:
   * it speaks TLS to the coordinator; the ranks' Unix socket is plain. */
  char *relay_tls[6];
  int nrelay_tls;
  const char *relay_flag;
  char relay_bin[PATH_MAX];
  /* A build tree's Python package (BIN/../python, holding gradsync/), put
   * first on a command's PYTHONPATH; "" when there is none. */
  char python_dir[PATH_MAX];
  char **pass; /* arguments passed to every agent */
  int npass;
  int pass_dashes; /* how many of them came before "--" */
  /* gradsync-coordinator's flags, with their values, for the coordinator
   * it starts (coord_args.c); borrowed from argv. */
  char **coord_args;
  int ncoord;
  gs_launch_env_t env; /* the environment sources; STR values may borrow its strings */
} gs_run_config_t;

typedef enum gs_run_phase {
  GS_RUN_STARTING,    /* waiting for the coordinator's address (and the node agent's) */
  GS_RUN_RUNNING,     /* agents started */
  GS_RUN_STOP_AGENTS, /* agents sent SIGTERM (or all finished) */
  GS_RUN_STOP_COORD,  /* no agent left; coordinator sent SIGTERM */
  GS_RUN_DONE,        /* every child reaped */
} gs_run_phase_t;

struct gs_run {
  gs_run_config_t cfg;
  gs_run_phase_t phase;
  pid_t self;
  int sigfd;
  int devnull;
  sigset_t orig_mask;
  struct rlimit orig_nofile;
  bool nofile_raised; /* children get orig_nofile back */
  gs_run_child_t coord;
  gs_run_child_t relay;   /* the node agent (--node-agent) */
  gs_run_child_t *agents; /* cfg.nproc of them */
  /* The coordinator address the ranks get: cfg.rpc, or the node agent's
   * "unix:PATH"; and with a node agent, the address they listen on for
   * their peers unless the environment names one ("": none). */
  char rank_rpc[320];
  char rank_bind[64];
  char relay_dir[PATH_MAX]; /* the node agent's socket's private folder ("": none) */
  int agents_running;
  int agents_pending; /* reaped, waiting to be restarted */
  long restarts;      /* restarts done, all slots together */
  long lost;          /* elastic: ranks that failed for good while the others went on */
  long finished;      /* ranks that exited 0 */
  int exit_code;      /* the first reason to fail; 0 while none */
  int gpus;           /* GPUs the ranks will see (gs__run_count_gpus); -1: unknown */
  uint64_t ready_deadline, agents_deadline, coord_deadline; /* ms; 0: none */
};

/* say.c: the launcher's own output. */
void gs__run_write_all(int fd, const char *buf, size_t len);
void gs__run_say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
const char *gs__run_signal_name(int sig, char *buf, size_t len);
const char *gs__run_describe_status(int status, char *buf, size_t len);

/* stream.c: reading a child's pipe and handing its lines to on_line. */
void gs__run_stream_init(gs_run_stream_t *s, gs_run_line_fn on_line, void *data);
void gs__run_stream_open(gs_run_stream_t *s, int fd, int out_fd);
bool gs__run_stream_pump(gs_run_stream_t *s);
void gs__run_stream_close(gs_run_stream_t *s);

/* spawn.c: starting and signalling children. */
int gs__run_open_std_fds(void);
int gs__run_raise_nofile(gs_run_t *r);
int gs__run_spawn(gs_run_t *r, gs_run_child_t *c, char *const argv[]);
int gs__run_spawn_rank(gs_run_t *r, gs_run_child_t *c);
void gs__run_signal_child(gs_run_child_t *c, int sig);

/* stop.c: stopping in order (agents, then the coordinator) and deadlines. */
void gs__run_fail(gs_run_t *r, int code);
/* Drops the restarts still waiting, saying `why` for each (while
 * stopping, or once an elastic job finished: nothing is restarted). */
void gs__run_drop_restarts(gs_run_t *r, const char *why);
void gs__run_advance(gs_run_t *r);
void gs__run_begin_stop(gs_run_t *r);
void gs__run_kill_everything(gs_run_t *r);
void gs__run_on_stop_signal(gs_run_t *r, int sig);
void gs__run_check_deadlines(gs_run_t *r);
int gs__run_next_timeout(const gs_run_t *r);

/* restart.c: a failed rank started again (--max-restarts). */
bool gs__run_restart_later(gs_run_t *r, gs_run_child_t *c, const char *how);
void gs__run_start_due_restarts(gs_run_t *r);

/* devices.c: the GPUs a rank will see (counted in a child process; -1:
 * cannot tell), and the launcher's line saying the ranks use the CPU when
 * it knows they all do. */
int gs__run_count_gpus(void);
void gs__run_say_devices(const gs_run_t *r);

/* node_agent.c: the node agent (--node-agent). Starts it for this node's
 * ranks once cfg.rpc is known; 0 or an error it said. */
int gs__run_start_node_agent(gs_run_t *r);
/* Recognises its "listening" line: then the ranks' address is its socket. */
bool gs__run_node_agent_ready(gs_run_t *r, const char *line, size_t len);
/* The node agent died while the ranks run: starts it again on the same
 * socket (its ranks redial it and rejoin through it) while
 * --node-agent-restarts allows; true then, false when the run is to stop. */
bool gs__run_restart_node_agent(gs_run_t *r, const char *how);
/* Removes its socket's folder (at exit). */
void gs__run_node_agent_cleanup(gs_run_t *r);

/* supervise.c: lines from children, starting the agents, reaping. */
void gs__run_on_line(gs_run_stream_t *s, const char *line, size_t len);
void gs__run_start_agents(gs_run_t *r);
void gs__run_reap(gs_run_t *r);
void gs__run_kill_and_reap_all(gs_run_t *r);

/* adopt.c: what the children leave behind (we are their subreaper). */
void gs__run_reap_adopted(pid_t self);

/* loop.c: signals through a signalfd, and the poll loop. */
int gs__run_setup_signals(gs_run_t *r);
int gs__run_loop(gs_run_t *r);

/* coord_args.c: gradsync-coordinator's flags among the arguments. Takes
 * those before "--" out of cfg->pass into cfg->coord_args, checking their
 * values with the coordinator's table, or refuses them (--coordinator
 * given, a flag gradsync-run sets, TLS): 0 or an exit status. */
int gs__run_take_coord_flags(gs_run_config_t *cfg);
/* Refuses a flag of the coordinator alone after "--" among the agents'. */
int gs__run_check_misplaced(const gs_run_config_t *cfg);
/* The list of them in --help. */
void gs__run_help_coord_flags(FILE *out);

/* options.c: flags (and their environment sources, launch_env.h) and the
 * programs to start. Returns 0 to run, or an exit status (-1: exit 0).
 * cfg->pass is allocated; the caller frees it. */
int gs__run_parse_args(int argc, char **argv, gs_run_config_t *cfg);
int gs__run_resolve_bins(gs_run_config_t *cfg);

#endif
