/* gradsync-run: the local launcher (like `torchrun --standalone`). It starts a
 * coordinator on a free port and N agents pointed at it, forwards their output
 * line by line with a "[rank i] " prefix, forwards stop signals, and stops
 * every process when one rank fails. Children never outlive it: each runs in
 * its own process group (so a terminal's Ctrl-C reaches only the launcher,
 * which stops the agents before the coordinator), gets PR_SET_PDEATHSIG and
 * is reaped; as a subreaper it also kills what the children leave behind.
 * Launcher messages ("gradsync-run: ...") go to stderr. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "error.h"
#include "parse.h"
#include "clock.h"

#ifndef GS_VERSION
#define GS_VERSION "unknown"
#endif

#define GS_RUN_MAX_NPROC 1024
#define GS_RUN_LINE_MAX 8192  /* longer lines are forwarded in pieces */
#define GS_RUN_READY_MS 10000 /* how long the coordinator has to print its address */
#define GS_RUN_DRAIN_MS 1000  /* how long a reaped child's pipes get to reach EOF */
#define GS_RUN_TOKEN_MAX 255  /* the coordinator's limit */
#define GS_RUN_USAGE_ERR 2

/* One pipe from a child: bytes read but not yet forwarded as a line. */
typedef struct gs_run_stream {
  int fd;     /* read end; -1 once closed */
  int out_fd; /* where its lines go: 1 (stdout) or 2 (stderr) */
  size_t len;
  char buf[GS_RUN_LINE_MAX];
} gs_run_stream_t;

typedef struct gs_run_child {
  pid_t pid;    /* also its process group id */
  bool running; /* started and not yet reaped */
  int rank;     /* -1 for the coordinator */
  char prefix[32];
  uint64_t drain_deadline; /* once reaped: when its pipes get closed */
  gs_run_stream_t out, err;
} gs_run_child_t;

typedef struct gs_run_config {
  long nproc;
  const char *job;
  const char *http;
  const char *grace_text; /* as the user wrote it, for messages */
  uint64_t grace_ms;
  const char *coord_flag, *agent_flag; /* --coordinator-bin / --agent-bin, or NULL */
  char coord_bin[PATH_MAX];
  char agent_bin[PATH_MAX];
  char **pass; /* arguments passed to every agent */
  int npass;
} gs_run_config_t;

typedef enum gs_run_phase {
  GS_RUN_STARTING,    /* waiting for the coordinator's address */
  GS_RUN_RUNNING,     /* agents started */
  GS_RUN_STOP_AGENTS, /* agents sent SIGTERM (or all finished) */
  GS_RUN_STOP_COORD,  /* no agent left; coordinator sent SIGTERM */
  GS_RUN_DONE,        /* every child reaped */
} gs_run_phase_t;

typedef struct gs_run {
  gs_run_config_t cfg;
  gs_run_phase_t phase;
  pid_t self;
  int sigfd;
  int devnull;
  sigset_t orig_mask;
  struct rlimit orig_nofile;
  bool nofile_raised; /* children get orig_nofile back */
  gs_run_child_t coord;
  gs_run_child_t *agents; /* cfg.nproc of them */
  int agents_running;
  int exit_code; /* the first reason to fail; 0 while none */
  uint64_t ready_deadline, agents_deadline, coord_deadline; /* ms; 0: none */
} gs_run_t;

/* Writes all of buf, retrying on EINTR and waiting when fd is non-blocking;
 * gives up silently on other errors (a closed stdout must not stop the run). */
static void write_all(int fd, const char *buf, size_t len)
{
  while (len > 0) {
    ssize_t n = write(fd, buf, len);

    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && errno == EAGAIN) {
      struct pollfd p = {.fd = fd, .events = POLLOUT};

      poll(&p, 1, -1);
      continue;
    }
    if (n <= 0)
      return;
    buf += n;
    len -= (size_t)n;
  }
}

/* Prints one launcher message to stderr, "gradsync-run: ..." in one write. */
static void __attribute__((format(printf, 1, 2))) say(const char *fmt, ...)
{
  char line[1024];
  va_list ap;
  int n;

  n = snprintf(line, sizeof(line), "gradsync-run: ");
  va_start(ap, fmt);
  n += vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
  va_end(ap);
  if (n > (int)sizeof(line) - 2)
    n = (int)sizeof(line) - 2;
  line[n++] = '\n';
  write_all(2, line, (size_t)n);
}

static const char *signal_name(int sig, char *buf, size_t len)
{
  const char *abbrev = sigabbrev_np(sig);

  if (abbrev)
    snprintf(buf, len, "SIG%s", abbrev);
  else
    snprintf(buf, len, "signal %d", sig);
  return buf;
}

/* "exited with status 3" or "killed by signal SIGKILL", for messages. */
static const char *describe_status(int status, char *buf, size_t len)
{
  char name[32];

  if (WIFEXITED(status))
    snprintf(buf, len, "exited with status %d", WEXITSTATUS(status));
  else if (WIFSIGNALED(status))
    snprintf(buf, len, "killed by signal %s%s", signal_name(WTERMSIG(status), name, sizeof(name)),
             WCOREDUMP(status) ? " (core dumped)" : "");
  else
    snprintf(buf, len, "ended with wait status 0x%x", (unsigned)status);
  return buf;
}

static void usage(FILE *out)
{
  fprintf(out,
          "usage: gradsync-run --nproc N [options] [--] [agent flags...]\n"
          "\n"
          "Starts a gradsync coordinator on this machine and N agents joined to it, and\n"
          "prints each line they write prefixed with \"[rank i] \" (\"[coordinator] \").\n"
          "When one rank fails the others are stopped. Exit status: 0 when every rank\n"
          "finished; the failing rank's status (1..125) or 1 when one failed; 128+N when\n"
          "stopped by signal N.\n"
          "\n"
          "  --nproc N                  number of agents, 1..%d (required)\n"
          "  --job NAME                 job name (default \"local\")\n"
          "  --http HOST:PORT           coordinator HTTP address (default 127.0.0.1:0,\n"
          "                             any free port)\n"
          "  --token TOKEN              shared secret (default: $GRADSYNC_TOKEN); handed to\n"
          "                             the coordinator and agents in $GRADSYNC_TOKEN\n"
          "  --coordinator-bin PATH     coordinator program (default: gradsync-coordinator\n"
          "                             next to this program)\n"
          "  --agent-bin PATH           agent program (default: gradsync-agent next to\n"
          "                             this program)\n"
          "  --grace DURATION           wait this long after SIGTERM before SIGKILL when\n"
          "                             stopping (default 10s)\n"
          "  --version                  print the version and exit\n"
          "  -h, --help                 print this help and exit\n"
          "\n"
          "Every other argument, and everything after \"--\", goes to each agent unchanged,\n"
          "after --coordinator H:P --job NAME --world-size N --local-rank i. Agents also\n"
          "get LOCAL_RANK, WORLD_SIZE and LOCAL_WORLD_SIZE in their environment; with\n"
          "fewer GPUs than --nproc they pick the cpu device unless told --device.\n"
          "SIGINT, SIGTERM and SIGHUP stop the agents with SIGTERM, then the coordinator;\n"
          "a SIGINT while stopping kills everything at once.\n",
          GS_RUN_MAX_NPROC);
}

/* Matches launcher flag `name` at argv[*i] as "--name VALUE" or
 * "--name=VALUE"; on a match stores the value (NULL if missing, with a
 * message) and advances *i past it. */
static bool take_flag(int argc, char **argv, int *i, const char *name, char **val)
{
  size_t n = strlen(name);
  char *a = argv[*i];

  if (strncmp(a, name, n) != 0 || (a[n] != '\0' && a[n] != '='))
    return false;
  if (a[n] == '=') {
    *val = a + n + 1;
  } else if (*i + 1 < argc) {
    *val = argv[++*i];
  } else {
    fprintf(stderr, "gradsync-run: %s needs a value\n", name);
    *val = NULL;
  }
  return true;
}

/* Agent flags the launcher sets itself: passing them again would override it. */
static bool is_reserved(const char *arg)
{
  static const char *const reserved[] = {"--coordinator", "--job", "--world-size", "--local-rank"};

  for (size_t i = 0; i < sizeof(reserved) / sizeof(reserved[0]); i++) {
    size_t n = strlen(reserved[i]);

    if (strncmp(arg, reserved[i], n) == 0 && (arg[n] == '\0' || arg[n] == '='))
      return true;
  }
  return false;
}

/* Puts the token in $GRADSYNC_TOKEN for the children and blanks it in our
 * own argv so it does not show in /proc/PID/cmdline. */
static int take_token(char *token)
{
  if (token[0] == '\0' || strlen(token) > GS_RUN_TOKEN_MAX) {
    fprintf(stderr, "gradsync-run: invalid value (hidden) for --token: expected 1 to %d bytes\n",
            GS_RUN_TOKEN_MAX);
    return GS_RUN_USAGE_ERR;
  }
  if (setenv("GRADSYNC_TOKEN", token, 1) != 0) {
    fprintf(stderr, "gradsync-run: cannot set GRADSYNC_TOKEN: %s\n", strerror(errno));
    return 1;
  }
  memset(token, 'x', strlen(token));
  return 0;
}

/* Parses one launcher flag at argv[*i] (returns 0 and sets *used), or leaves
 * it for the agents; returns an exit status on error, -1 for help/version. */
static int parse_one(int argc, char **argv, int *i, gs_run_config_t *cfg, bool *used)
{
  char *v = NULL;

  *used = true;
  if (!strcmp(argv[*i], "-h") || !strcmp(argv[*i], "--help")) {
    usage(stdout);
    return -1;
  }
  if (!strcmp(argv[*i], "--version")) {
    printf("gradsync-run %s\n", GS_VERSION);
    return -1;
  }
  if (take_flag(argc, argv, i, "--nproc", &v)) {
    if (v && gs_parse_long(v, 1, GS_RUN_MAX_NPROC, &cfg->nproc) != 0) {
      fprintf(stderr, "gradsync-run: invalid value '%s' for --nproc: expected 1 to %d\n", v,
              GS_RUN_MAX_NPROC);
      return GS_RUN_USAGE_ERR;
    }
  } else if (take_flag(argc, argv, i, "--job", &v)) {
    cfg->job = v;
  } else if (take_flag(argc, argv, i, "--http", &v)) {
    char host[256];
    uint16_t port;

    if (v && gs_parse_addr(v, host, sizeof(host), &port) != 0) {
      fprintf(stderr, "gradsync-run: invalid value '%s' for --http: expected HOST:PORT\n", v);
      return GS_RUN_USAGE_ERR;
    }
    cfg->http = v;
  } else if (take_flag(argc, argv, i, "--token", &v)) {
    if (v)
      return take_token(v);
  } else if (take_flag(argc, argv, i, "--coordinator-bin", &v)) {
    cfg->coord_flag = v;
  } else if (take_flag(argc, argv, i, "--agent-bin", &v)) {
    cfg->agent_flag = v;
  } else if (take_flag(argc, argv, i, "--grace", &v)) {
    if (v && gs_parse_duration_ms(v, &cfg->grace_ms) != 0) {
      fprintf(stderr,
              "gradsync-run: invalid value '%s' for --grace: expected a duration such "
              "as 500ms, 10s or 1m\n",
              v);
      return GS_RUN_USAGE_ERR;
    }
    cfg->grace_text = v;
  } else {
    *used = false;
    return 0;
  }
  return v ? 0 : GS_RUN_USAGE_ERR;
}

/* Parses argv into cfg (cfg->pass points into argv; caller frees the array).
 * Returns 0 to run, or an exit status (-1: exit 0). */
static int parse_args(int argc, char **argv, gs_run_config_t *cfg)
{
  bool after_dashes = false, used;
  int rc;

  cfg->job = "local";
  cfg->http = "127.0.0.1:0";
  cfg->grace_text = "10s";
  cfg->grace_ms = 10000;
  cfg->pass = calloc((size_t)argc, sizeof(*cfg->pass));
  if (!cfg->pass) {
    fprintf(stderr, "gradsync-run: out of memory\n");
    return 1;
  }
  for (int i = 1; i < argc; i++) {
    if (!after_dashes && !strcmp(argv[i], "--")) {
      after_dashes = true;
      continue;
    }
    if (!after_dashes) {
      rc = parse_one(argc, argv, &i, cfg, &used);
      if (rc)
        return rc;
      if (used)
        continue;
    }
    if (is_reserved(argv[i])) {
      fprintf(stderr, "gradsync-run: agent flag '%s' is set by the launcher (see --help)\n",
              argv[i]);
      return GS_RUN_USAGE_ERR;
    }
    cfg->pass[cfg->npass++] = argv[i];
  }
  if (cfg->nproc == 0) {
    fprintf(stderr, "gradsync-run: --nproc N is required (try 'gradsync-run --help')\n");
    return GS_RUN_USAGE_ERR;
  }
  if (cfg->job[0] == '\0') {
    fprintf(stderr, "gradsync-run: --job must not be empty\n");
    return GS_RUN_USAGE_ERR;
  }
  return 0;
}

/* Fills `out` with the program to run: the flag's value, or `name` in the
 * launcher's own directory; fails with a message if it cannot be executed. */
static int resolve_bin(const char *flag_value, const char *flag, const char *name, char *out,
                       size_t len)
{
  char self[PATH_MAX];
  ssize_t n;
  char *slash;
  int len_needed;

  if (flag_value) {
    len_needed = snprintf(out, len, "%s", flag_value);
  } else {
    n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n < 0) {
      fprintf(stderr, "gradsync-run: cannot read /proc/self/exe to find %s: %s (use %s PATH)\n",
              name, strerror(errno), flag);
      return 1;
    }
    self[n] = '\0';
    slash = strrchr(self, '/');
    if (slash)
      *slash = '\0';
    len_needed = snprintf(out, len, "%s/%s", self, name);
  }
  if (len_needed < 0 || (size_t)len_needed >= len) {
    fprintf(stderr, "gradsync-run: path of %s is too long (over %zu bytes)\n", name, len - 1);
    return 1;
  }
  if (access(out, X_OK) != 0 && flag_value) {
    fprintf(stderr, "gradsync-run: cannot execute %s '%s' (from %s): %s\n", name, out, flag,
            strerror(errno));
    return 1;
  }
  if (access(out, X_OK) != 0) {
    fprintf(stderr,
            "gradsync-run: cannot execute %s '%s': %s (install it next to gradsync-run or "
            "pass %s PATH)\n",
            name, out, strerror(errno), flag);
    return 1;
  }
  return 0;
}

/* Makes sure fds 0..2 are open, so that no pipe lands on them. */
static int open_std_fds(void)
{
  for (int fd = 0; fd < 3; fd++) {
    if (fcntl(fd, F_GETFD) >= 0)
      continue;
    if (open("/dev/null", O_RDWR) != fd)
      return GS_EIO;
  }
  return 0;
}

/* Raises the soft limit on open files to fit two pipes per child (the
 * children get the original limit back); fails if the hard limit is lower. */
static int raise_nofile(gs_run_t *r)
{
  rlim_t need = (rlim_t)(2 * r->cfg.nproc + 64);
  struct rlimit lim;

  if (getrlimit(RLIMIT_NOFILE, &r->orig_nofile) != 0)
    return 0;
  lim = r->orig_nofile;
  if (lim.rlim_cur == RLIM_INFINITY || lim.rlim_cur >= need)
    return 0;
  if (lim.rlim_max != RLIM_INFINITY && lim.rlim_max < need) {
    say("--nproc %ld needs about %lu open files but the limit is %lu; raise it (ulimit -n)",
        r->cfg.nproc, (unsigned long)need, (unsigned long)lim.rlim_max);
    return GS_ERANGE;
  }
  lim.rlim_cur = need;
  if (setrlimit(RLIMIT_NOFILE, &lim) != 0) {
    say("cannot raise the open-file limit to %lu: %s", (unsigned long)need, strerror(errno));
    return gs_err_from_errno(errno);
  }
  r->nofile_raised = true;
  return 0;
}

/* In the forked child: ties its life to the launcher, moves it to its own
 * process group, wires stdin to /dev/null and stdout/stderr to the pipes,
 * restores the signal mask and runs argv; exits 127 if it cannot. */
static void __attribute__((noreturn))
child_exec(const gs_run_t *r, const gs_run_child_t *c, char *const argv[], int out_fd, int err_fd)
{
  char msg[PATH_MAX + 128], num[24];
  int n, err;

  if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != r->self)
    _exit(127);
  setpgid(0, 0);
  if (dup2(r->devnull, 0) < 0 || dup2(out_fd, 1) < 0 || dup2(err_fd, 2) < 0)
    _exit(127);
  if (c->rank >= 0) {
    snprintf(num, sizeof(num), "%d", c->rank);
    setenv("LOCAL_RANK", num, 1);
    snprintf(num, sizeof(num), "%ld", r->cfg.nproc);
    setenv("WORLD_SIZE", num, 1);
    setenv("LOCAL_WORLD_SIZE", num, 1); /* every rank runs on this machine */
  }
  signal(SIGPIPE, SIG_DFL);
  if (r->nofile_raised)
    setrlimit(RLIMIT_NOFILE, &r->orig_nofile);
  sigprocmask(SIG_SETMASK, &r->orig_mask, NULL);
  execv(argv[0], argv);
  err = errno;
  n = snprintf(msg, sizeof(msg), "gradsync-run: cannot execute %s: %s%s\n", argv[0], strerror(err),
               err == ENOENT && access(argv[0], F_OK) == 0 ? " (is its #! interpreter missing?)"
                                                           : "");
  write_all(2, msg, n < (int)sizeof(msg) ? (size_t)n : sizeof(msg) - 1);
  _exit(127);
}

static void stream_init(gs_run_stream_t *s, int fd, int out_fd)
{
  s->fd = fd;
  s->out_fd = out_fd;
  s->len = 0;
}

/* Reports why child c could not be started and returns the error. */
static int spawn_error(const gs_run_child_t *c, char *const argv[], const char *call)
{
  int err = errno;

  if (c->rank >= 0)
    say("cannot start rank %d (%s): %s: %s", c->rank, argv[0], call, strerror(err));
  else
    say("cannot start the coordinator (%s): %s: %s", argv[0], call, strerror(err));
  return gs_err_from_errno(err);
}

/* Starts argv as child c with its output on two new pipes; says why not. */
static int spawn(gs_run_t *r, gs_run_child_t *c, char *const argv[])
{
  int out[2], err[2], rc;
  pid_t pid;

  if (pipe2(out, O_CLOEXEC) != 0)
    return spawn_error(c, argv, "pipe");
  if (pipe2(err, O_CLOEXEC) != 0) {
    rc = spawn_error(c, argv, "pipe");
    goto out_close_out;
  }
  pid = fork();
  if (pid < 0) {
    rc = spawn_error(c, argv, "fork");
    goto out_close_err;
  }
  if (pid == 0)
    child_exec(r, c, argv, out[1], err[1]);
  setpgid(pid, pid); /* the child does it too; whichever runs first wins */
  close(out[1]);
  close(err[1]);
  fcntl(out[0], F_SETFL, O_NONBLOCK);
  fcntl(err[0], F_SETFL, O_NONBLOCK);
  c->pid = pid;
  c->running = true;
  stream_init(&c->out, out[0], 1);
  stream_init(&c->err, err[0], 2);
  return 0;

out_close_err:
  close(err[0]);
  close(err[1]);
out_close_out:
  close(out[0]);
  close(out[1]);
  return rc;
}

/* Sends sig to child c's whole process group (its own children too). */
static void signal_child(gs_run_child_t *c, int sig)
{
  if (!c->running)
    return;
  if (kill(-c->pid, sig) != 0 && errno == ESRCH)
    kill(c->pid, sig);
}

static void signal_agents(gs_run_t *r, int sig)
{
  for (long i = 0; i < r->cfg.nproc; i++)
    signal_child(&r->agents[i], sig);
}

/* Records the run's exit status; the first failure wins. */
static void fail(gs_run_t *r, int code)
{
  if (r->exit_code == 0)
    r->exit_code = code;
}

/* Moves through the stop phases as children go: agents first, then the
 * coordinator (SIGTERM, SIGKILL after the grace period), then done. */
static void advance(gs_run_t *r)
{
  if (r->phase == GS_RUN_RUNNING && r->agents_running == 0)
    r->phase = GS_RUN_STOP_AGENTS;
  if (r->phase == GS_RUN_STOP_AGENTS && r->agents_running == 0) {
    r->phase = GS_RUN_STOP_COORD;
    r->agents_deadline = 0;
    if (r->coord.running) {
      signal_child(&r->coord, SIGTERM);
      r->coord_deadline = gs_now_ms() + r->cfg.grace_ms;
    }
  }
  if (r->phase == GS_RUN_STOP_COORD && !r->coord.running) {
    r->phase = GS_RUN_DONE;
    r->coord_deadline = 0;
  }
}

/* Starts stopping: SIGTERM to every running agent, SIGKILL after the grace
 * period (see check_deadlines); no-op when already stopping. */
static void begin_stop(gs_run_t *r)
{
  if (r->phase == GS_RUN_STARTING || r->phase == GS_RUN_RUNNING) {
    r->phase = GS_RUN_STOP_AGENTS;
    if (r->agents_running > 0) {
      signal_agents(r, SIGTERM);
      r->agents_deadline = gs_now_ms() + r->cfg.grace_ms;
    }
  }
  advance(r);
}

/* Starts the N agents once the coordinator's RPC address is known. */
static void start_agents(gs_run_t *r, const char *rpc)
{
  char world[24], rank[24];
  char **argv;
  int k = 0, rc;

  r->phase = GS_RUN_RUNNING;
  argv = calloc((size_t)r->cfg.npass + 10, sizeof(*argv));
  if (!argv) {
    say("out of memory starting the ranks");
    fail(r, 1);
    begin_stop(r);
    return;
  }
  snprintf(world, sizeof(world), "%ld", r->cfg.nproc);
  argv[k++] = r->cfg.agent_bin;
  argv[k++] = "--coordinator";
  argv[k++] = (char *)rpc;
  argv[k++] = "--job";
  argv[k++] = (char *)r->cfg.job;
  argv[k++] = "--world-size";
  argv[k++] = world;
  argv[k++] = "--local-rank";
  argv[k++] = rank;
  memcpy(argv + k, r->cfg.pass, (size_t)r->cfg.npass * sizeof(*argv));
  for (long i = 0; i < r->cfg.nproc; i++) {
    snprintf(rank, sizeof(rank), "%ld", i);
    rc = spawn(r, &r->agents[i], argv);
    if (rc) {
      fail(r, 1);
      begin_stop(r);
      break;
    }
    r->agents_running++;
  }
  free(argv);
}

/* Recognises the coordinator's "listening" line, announces the addresses
 * and starts the agents; false for any other line. */
static bool coordinator_ready(gs_run_t *r, const char *data, size_t len)
{
  char line[640], rpc[300], http[300], host[300], shown[310];
  const char *colon;

  if (len >= sizeof(line))
    return false;
  memcpy(line, data, len);
  line[len] = '\0';
  if (sscanf(line, "gradsync-coordinator listening rpc=%299s http=%299s", rpc, http) != 2)
    return false;
  colon = strrchr(http, ':');
  if (!colon)
    return false;
  snprintf(host, sizeof(host), "%.*s", (int)(colon - http), http);
  /* A wildcard address is reachable on loopback; IPv6 needs brackets. */
  if (!strcmp(host, "0.0.0.0") || host[0] == '\0')
    snprintf(shown, sizeof(shown), "127.0.0.1");
  else if (!strcmp(host, "::"))
    snprintf(shown, sizeof(shown), "[::1]");
  else if (strchr(host, ':') && host[0] != '[')
    snprintf(shown, sizeof(shown), "[%s]", host);
  else
    snprintf(shown, sizeof(shown), "%s", host);
  say("coordinator rpc=%s, status at http://%s%s/status", rpc, shown, colon);
  r->ready_deadline = 0;
  start_agents(r, rpc);
  return true;
}

/* One complete line (or a piece of an overlong one) from child c. */
static void on_line(gs_run_t *r, gs_run_child_t *c, gs_run_stream_t *s, const char *data,
                    size_t len)
{
  char line[sizeof(c->prefix) + GS_RUN_LINE_MAX + 1];
  size_t p = strlen(c->prefix);

  if (c == &r->coord && s == &c->out && r->phase == GS_RUN_STARTING &&
      coordinator_ready(r, data, len))
    return;
  memcpy(line, c->prefix, p);
  memcpy(line + p, data, len);
  line[p + len] = '\n';
  write_all(s->out_fd, line, p + len + 1);
}

/* Forwards the complete lines in s->buf, or all of it when it is full. */
static void stream_lines(gs_run_t *r, gs_run_child_t *c, gs_run_stream_t *s)
{
  char *start = s->buf, *nl;
  size_t left = s->len;

  while ((nl = memchr(start, '\n', left)) != NULL) {
    on_line(r, c, s, start, (size_t)(nl - start));
    left -= (size_t)(nl - start) + 1;
    start = nl + 1;
  }
  if (left == sizeof(s->buf)) {
    on_line(r, c, s, start, left);
    left = 0;
  }
  memmove(s->buf, start, left);
  s->len = left;
}

/* Forwards a last unterminated line and closes the pipe. */
static void stream_close(gs_run_t *r, gs_run_child_t *c, gs_run_stream_t *s)
{
  if (s->fd < 0)
    return;
  if (s->len > 0)
    on_line(r, c, s, s->buf, s->len);
  s->len = 0;
  close(s->fd);
  s->fd = -1;
}

/* Reads what the pipe has (one read, to be fair to the other pipes) and
 * forwards its complete lines; closes it at EOF or on error. Returns true
 * when it read something (more may be waiting). */
static bool stream_pump(gs_run_t *r, gs_run_child_t *c, gs_run_stream_t *s)
{
  ssize_t n;

  do
    n = read(s->fd, s->buf + s->len, sizeof(s->buf) - s->len);
  while (n < 0 && errno == EINTR);
  if (n < 0 && errno == EAGAIN)
    return false;
  if (n <= 0) {
    stream_close(r, c, s);
    return false;
  }
  s->len += (size_t)n;
  stream_lines(r, c, s);
  return true;
}

/* After c was reaped: forwards what its pipes already hold, so that it
 * comes before the exit message, and gives them GS_RUN_DRAIN_MS to reach EOF
 * (check_deadlines closes them then: a process that escaped the child's
 * group may hold them open). */
static void drain_child(gs_run_t *r, gs_run_child_t *c)
{
  for (int k = 0; k < 64 && c->out.fd >= 0 && stream_pump(r, c, &c->out); k++)
    ;
  for (int k = 0; k < 64 && c->err.fd >= 0 && stream_pump(r, c, &c->err); k++)
    ;
  c->drain_deadline = gs_now_ms() + GS_RUN_DRAIN_MS;
}

/* A reaped child whose pipes are still open. */
static bool is_draining(const gs_run_child_t *c)
{
  return !c->running && (c->out.fd >= 0 || c->err.fd >= 0);
}

/* The coordinator was reaped: a failure unless we were stopping it. */
static void on_coordinator_exit(gs_run_t *r, int status)
{
  bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  char how[80];

  describe_status(status, how, sizeof(how));
  if (r->phase == GS_RUN_STARTING) {
    say("coordinator %s before it was ready (its output is above)", how);
    fail(r, 1);
  } else if (r->phase == GS_RUN_RUNNING || r->phase == GS_RUN_STOP_AGENTS) {
    say("coordinator %s while ranks were running", how);
    if (r->phase == GS_RUN_RUNNING && r->agents_running > 0)
      say("stopping the ranks");
    fail(r, 1);
  } else if (!ok) {
    say("coordinator %s", how);
  }
  begin_stop(r);
}

/* Rank c was reaped: the first rank to fail stops the others and sets the
 * exit status. */
static void on_agent_exit(gs_run_t *r, gs_run_child_t *c, int status)
{
  char how[80];

  r->agents_running--;
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
    advance(r);
    return;
  }
  say("rank %d %s", c->rank, describe_status(status, how, sizeof(how)));
  if (r->phase != GS_RUN_RUNNING) {
    advance(r);
    return;
  }
  fail(r, WIFEXITED(status) && WEXITSTATUS(status) <= 125 ? WEXITSTATUS(status) : 1);
  if (r->agents_running > 0)
    say("stopping the other ranks");
  begin_stop(r);
}

static gs_run_child_t *find_child(gs_run_t *r, pid_t pid)
{
  if (r->coord.running && r->coord.pid == pid)
    return &r->coord;
  for (long i = 0; i < r->cfg.nproc; i++)
    if (r->agents[i].running && r->agents[i].pid == pid)
      return &r->agents[i];
  return NULL;
}

/* Reaps every exited child. While it is still a zombie its process group id
 * cannot be reused, so what it left running in its group is killed first. */
static void reap(gs_run_t *r)
{
  gs_run_child_t *c;
  siginfo_t si;
  int status;

  for (;;) {
    memset(&si, 0, sizeof(si));
    if (waitid(P_ALL, 0, &si, WEXITED | WNOHANG | WNOWAIT) != 0) {
      if (errno == EINTR)
        continue;
      return;
    }
    if (si.si_pid == 0)
      return;
    c = find_child(r, si.si_pid);
    if (c)
      kill(-c->pid, SIGKILL);
    while (waitpid(si.si_pid, &status, 0) < 0 && errno == EINTR)
      ;
    if (!c)
      continue;
    c->running = false;
    drain_child(r, c);
    if (c == &r->coord)
      on_coordinator_exit(r, status);
    else
      on_agent_exit(r, c, status);
  }
}

static void kill_everything(gs_run_t *r)
{
  signal_agents(r, SIGKILL);
  signal_child(&r->coord, SIGKILL);
  r->agents_deadline = r->coord_deadline = 0;
}

/* SIGINT, SIGTERM or SIGHUP: the first stops the run in order; a SIGINT
 * while stopping kills everything now. */
static void on_stop_signal(gs_run_t *r, int sig)
{
  char name[32];

  signal_name(sig, name, sizeof(name));
  if (r->phase == GS_RUN_STARTING || r->phase == GS_RUN_RUNNING) {
    if (r->phase == GS_RUN_STARTING)
      say("received %s; stopping the coordinator", name);
    else
      say("received %s; stopping %d rank%s (SIGINT again kills them now)", name, r->agents_running,
          r->agents_running == 1 ? "" : "s");
    fail(r, 128 + sig);
    begin_stop(r);
  } else if (sig == SIGINT) {
    say("received SIGINT while stopping; killing every process now");
    kill_everything(r);
  }
}

/* Reads every pending signal from the signalfd, then reaps (SIGCHLD may be
 * merged, so it always looks). */
static void handle_signals(gs_run_t *r)
{
  struct signalfd_siginfo si;
  ssize_t n;

  for (;;) {
    n = read(r->sigfd, &si, sizeof(si));
    if (n < 0 && errno == EINTR)
      continue;
    if (n != (ssize_t)sizeof(si))
      break;
    if (si.ssi_signo != SIGCHLD)
      on_stop_signal(r, (int)si.ssi_signo);
  }
  reap(r);
}

/* Sends SIGKILL once a grace period or the startup deadline has passed. */
static void check_deadlines(gs_run_t *r)
{
  uint64_t now = gs_now_ms();

  if (r->phase == GS_RUN_STARTING && now >= r->ready_deadline) {
    say("coordinator %s did not print its address within %d s; stopping it", r->cfg.coord_bin,
        GS_RUN_READY_MS / 1000);
    fail(r, 1);
    r->ready_deadline = 0;
    begin_stop(r);
  }
  if (r->agents_deadline && now >= r->agents_deadline) {
    for (long i = 0; i < r->cfg.nproc; i++) {
      if (!r->agents[i].running)
        continue;
      say("rank %ld did not stop within %s of SIGTERM; sending SIGKILL", i, r->cfg.grace_text);
      signal_child(&r->agents[i], SIGKILL);
    }
    r->agents_deadline = 0;
  }
  for (long i = -1; i < r->cfg.nproc; i++) {
    gs_run_child_t *c = i < 0 ? &r->coord : &r->agents[i];

    if (is_draining(c) && now >= c->drain_deadline) {
      stream_close(r, c, &c->out);
      stream_close(r, c, &c->err);
    }
  }
  if (r->coord_deadline && now >= r->coord_deadline) {
    if (r->coord.running)
      say("coordinator did not stop within %s of SIGTERM; sending SIGKILL", r->cfg.grace_text);
    signal_child(&r->coord, SIGKILL);
    r->coord_deadline = 0;
  }
}

/* Milliseconds until the next deadline, or -1 when there is none. */
static int next_timeout(const gs_run_t *r)
{
  uint64_t next = UINT64_MAX, now = gs_now_ms();

  if (r->phase == GS_RUN_STARTING && r->ready_deadline)
    next = r->ready_deadline;
  if (r->agents_deadline && r->agents_deadline < next)
    next = r->agents_deadline;
  if (r->coord_deadline && r->coord_deadline < next)
    next = r->coord_deadline;
  for (long i = -1; i < r->cfg.nproc; i++) {
    const gs_run_child_t *c = i < 0 ? &r->coord : &r->agents[i];

    if (is_draining(c) && c->drain_deadline < next)
      next = c->drain_deadline;
  }
  if (next == UINT64_MAX)
    return -1;
  return next <= now ? 0 : (int)(next - now);
}

/* Appends c's open pipes to the poll set. */
static void add_child_fds(gs_run_child_t *c, struct pollfd *p, gs_run_child_t **owner,
                          gs_run_stream_t **which, int *n)
{
  gs_run_stream_t *s[2] = {&c->out, &c->err};

  for (int k = 0; k < 2; k++) {
    if (s[k]->fd < 0)
      continue;
    p[*n] = (struct pollfd){.fd = s[k]->fd, .events = POLLIN};
    owner[*n] = c;
    which[*n] = s[k];
    (*n)++;
  }
}

/* The event loop: one poll over the signalfd and every child's pipes, until
 * every child is reaped and its output forwarded. */
static int run_loop(gs_run_t *r)
{
  size_t cap = 2 * ((size_t)r->cfg.nproc + 1) + 1;
  struct pollfd *p = calloc(cap, sizeof(*p));
  gs_run_child_t **owner = calloc(cap, sizeof(*owner));
  gs_run_stream_t **which = calloc(cap, sizeof(*which));
  int n, rc = 0;

  if (!p || !owner || !which) {
    rc = GS_ENOMEM;
    goto out_free;
  }
  for (;;) {
    n = 0;
    p[n++] = (struct pollfd){.fd = r->sigfd, .events = POLLIN};
    add_child_fds(&r->coord, p, owner, which, &n);
    for (long i = 0; i < r->cfg.nproc; i++)
      add_child_fds(&r->agents[i], p, owner, which, &n);
    /* Done once every child is reaped and its pipes are closed. */
    if (r->phase == GS_RUN_DONE && n == 1)
      break;
    if (poll(p, (nfds_t)n, next_timeout(r)) < 0 && errno != EINTR) {
      rc = gs_err_from_errno(errno);
      say("poll failed: %s", strerror(errno));
      break;
    }
    if (p[0].revents)
      handle_signals(r);
    for (int k = 1; k < n; k++) {
      /* A stream closed by handle_signals no longer has this fd. */
      if (p[k].revents && which[k]->fd == p[k].fd)
        stream_pump(r, owner[k], which[k]);
    }
    check_deadlines(r);
  }
out_free:
  free(which);
  free(owner);
  free(p);
  return rc;
}

/* Last resort when the loop cannot run: SIGKILL every child and reap it. */
static void kill_and_reap_all(gs_run_t *r)
{
  kill_everything(r);
  while (r->coord.running || r->agents_running > 0) {
    int status;
    pid_t pid = waitpid(-1, &status, 0);
    gs_run_child_t *c;

    if (pid < 0 && errno == EINTR)
      continue;
    if (pid < 0)
      break;
    c = find_child(r, pid);
    if (!c)
      continue;
    c->running = false;
    if (c != &r->coord)
      r->agents_running--;
    stream_close(r, c, &c->out);
    stream_close(r, c, &c->err);
  }
}

/* Sends SIGKILL to every live child of ours that is no gs_run_child_t: with
 * PR_SET_CHILD_SUBREAPER, processes our children left behind (even outside
 * their process groups) become ours. */
static void kill_adopted(pid_t self)
{
  char path[64], stat[512], *paren;
  struct dirent *d;
  int fd;
  ssize_t n;
  long ppid;
  DIR *proc;

  proc = opendir("/proc");
  if (!proc)
    return;
  while ((d = readdir(proc)) != NULL) {
    if (d->d_name[0] < '1' || d->d_name[0] > '9')
      continue;
    snprintf(path, sizeof(path), "/proc/%.16s/stat", d->d_name);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
      continue;
    n = read(fd, stat, sizeof(stat) - 1);
    close(fd);
    if (n <= 0)
      continue;
    stat[n] = '\0';
    /* "pid (comm) state ppid ...": comm may hold ')' itself. */
    paren = strrchr(stat, ')');
    if (!paren || sscanf(paren + 1, " %*c %ld", &ppid) != 1 || ppid != (long)self)
      continue;
    kill((pid_t)atol(d->d_name), SIGKILL);
  }
  closedir(proc);
}

/* Kills and reaps whatever our children left behind, for up to two
 * seconds (killing one may hand us its own children). */
static void reap_adopted(pid_t self)
{
  struct timespec tick = {.tv_sec = 0, .tv_nsec = 10 * 1000000};
  int status;
  pid_t pid;

  for (int round = 0; round < 200; round++) {
    kill_adopted(self);
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0)
      ;
    if (pid < 0 && errno == ECHILD)
      return;
    nanosleep(&tick, NULL);
  }
}

/* Blocks the signals the loop reads from a signalfd (children restore the
 * original mask) and ignores SIGPIPE from a closed stdout. */
static int setup_signals(gs_run_t *r)
{
  sigset_t set;

  sigemptyset(&set);
  sigaddset(&set, SIGCHLD);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGHUP);
  if (sigprocmask(SIG_BLOCK, &set, &r->orig_mask) != 0)
    return gs_err_from_errno(errno);
  signal(SIGPIPE, SIG_IGN);
  r->sigfd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
  if (r->sigfd < 0)
    return gs_err_from_errno(errno);
  return 0;
}

/* Sets up and starts the coordinator; on failure nothing is left running. */
static int start(gs_run_t *r)
{
  char world[24];
  /* The job's size is known: the coordinator need not size itself (its
   * open-file limit) for the default maximum. */
  char *argv[] = {r->cfg.coord_bin, "--listen", "127.0.0.1:0", "--http", (char *)r->cfg.http,
                  "--max-world-size", world, NULL};
  int rc;

  snprintf(world, sizeof(world), "%ld", r->cfg.nproc);

  r->agents = calloc((size_t)r->cfg.nproc, sizeof(*r->agents));
  if (!r->agents) {
    say("out of memory for %ld ranks", r->cfg.nproc);
    return GS_ENOMEM;
  }
  for (long i = 0; i < r->cfg.nproc; i++) {
    r->agents[i].rank = (int)i;
    snprintf(r->agents[i].prefix, sizeof(r->agents[i].prefix), "[rank %ld] ", i);
    r->agents[i].out.fd = r->agents[i].err.fd = -1;
  }
  r->devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
  if (r->devnull < 0) {
    say("cannot open /dev/null: %s", strerror(errno));
    return GS_EIO;
  }
  rc = raise_nofile(r);
  if (rc)
    return rc;
  if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0)
    say("cannot become a subreaper (%s): processes the ranks leave behind may survive",
        strerror(errno));
  rc = setup_signals(r);
  if (rc) {
    say("cannot set up signal handling: %s", gs_strerror(rc));
    return rc;
  }
  rc = spawn(r, &r->coord, argv);
  if (rc)
    return rc;
  r->ready_deadline = gs_now_ms() + GS_RUN_READY_MS;
  return 0;
}

int main(int argc, char **argv)
{
  gs_run_t r;
  int rc;

  memset(&r, 0, sizeof(r));
  r.sigfd = r.devnull = -1;
  r.coord.rank = -1;
  r.coord.out.fd = r.coord.err.fd = -1;
  snprintf(r.coord.prefix, sizeof(r.coord.prefix), "[coordinator] ");
  r.self = getpid();
  if (open_std_fds() != 0)
    return 1;
  rc = parse_args(argc, argv, &r.cfg);
  if (rc)
    goto out_free_args;
  if (resolve_bin(r.cfg.coord_flag, "--coordinator-bin", "gradsync-coordinator", r.cfg.coord_bin,
                  sizeof(r.cfg.coord_bin)) ||
      resolve_bin(r.cfg.agent_flag, "--agent-bin", "gradsync-agent", r.cfg.agent_bin,
                  sizeof(r.cfg.agent_bin))) {
    rc = 1;
    goto out_free_args;
  }
  if (start(&r) != 0) {
    rc = 1;
    goto out_close;
  }
  if (run_loop(&r) != 0) {
    kill_and_reap_all(&r);
    fail(&r, 1);
  }
  reap_adopted(r.self);
  rc = r.exit_code;
  if (rc == 0)
    say("all %ld ranks finished", r.cfg.nproc);
out_close:
  if (r.sigfd >= 0)
    close(r.sigfd);
  if (r.devnull >= 0)
    close(r.devnull);
  free(r.agents);
out_free_args:
  free(r.cfg.pass);
  return rc < 0 ? 0 : rc;
}
