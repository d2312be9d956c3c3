/* gradsync._engine: libgradsync for Python, a thin CPython extension over
 * the public API (gradsync/engine.h). One type, Engine, with a method per
 * engine call; the blocking ones (start, sync_initial, end_step,
 * allreduce_sum, checkpoint waits, finish) release the GIL. Parameter and
 * gradient memory is handed out as Buffer objects (the buffer protocol),
 * each holding a reference to its Engine, so a tensor viewing pack memory
 * keeps the engine, and so that memory, alive. Every engine error becomes
 * a gradsync.Error (or subclass) carrying the engine's words; nothing here
 * can abort the interpreter. A step's result is a StepResult
 * (step_result.c). The pure-Python layer (gradsync/torch/) builds the
 * optimizer on top. */
#define PY_SSIZE_T_CLEAN
/* The stable ABI of Python 3.11 (the buffer protocol joined it then): one
 * build imports on every later Python, a GPU machine's too. */
#define Py_LIMITED_API 0x030B0000
#include <Python.h>

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <gradsync/engine.h>

#include "step_result.h"

/* The exceptions (module state would be cleaner; one interpreter only). */
static PyObject *error_base, *error_peer_lost, *error_model_mismatch, *error_timeout,
    *error_interrupted, *error_world_changed;

/* Set by our SIGTERM handler (and by SIGINT while a blocking call waits):
 * the engine's term_flag. A process has one. */
static volatile sig_atomic_t term_flag;

/* A SIGTERM again is the same request: schedulers send it twice
 * (slurmstepd signals every process of a step, and gradsync-run forwards
 * its own), and the stop must still write its checkpoint. */
static void on_term(int sig)
{
  if (term_flag == SIGTERM && sig == SIGTERM)
    return;
  term_flag = sig;
}

typedef struct {
  PyObject_HEAD gs_engine_t *engine;
  bool started, finished;
  bool on_device;        /* a cuda device: pack memory is GPU memory */
  gs_optim_kind_t optim; /* the engine's optimizer: its groups' defaults */
  uint32_t nparams;
  uint64_t *numel;            /* per registered param */
  PyObject *checkpoint_extra; /* the callable of checkpoint_extra=, or NULL */
} EngineObject;

/* A str's UTF-8 (owned by the str), or NULL with an exception set. */
static const char *utf8(PyObject *v)
{
  return PyUnicode_AsUTF8AndSize(v, NULL);
}

/* An address from Python (a tensor's data_ptr()); 0 is none. */
static bool parse_address(PyObject *v, void **out)
{
  unsigned long long a = PyLong_AsUnsignedLongLong(v);

  if (a == (unsigned long long)-1 && PyErr_Occurred())
    return false;
  *out = (void *)(uintptr_t)a;
  return true;
}

/* ---- errors --------------------------------------------------------- */

/* The exception class for a failure: the engine's words decide it where
 * its code alone cannot (a refused Join is INVALID_ARGUMENT whatever the
 * difference was). */
static PyObject *error_class(int err, const char *why)
{
  if (gs_engine_world_changed(err))
    return error_world_changed;
  if (term_flag &&
      (strstr(why, "interrupted by") || strstr(why, "SIGTERM") || strstr(why, "SIGINT")))
    return error_interrupted;
  if (strstr(why, "model unlike") || strstr(why, "model signature"))
    return error_model_mismatch;
  if (strstr(why, " lost") || strstr(why, "aborted generation") ||
      strstr(why, "peer rank failed") || strstr(why, "connection to rank"))
    return error_peer_lost;
  if (strstr(why, "timed out") || strstr(why, "deadline exceeded") || strstr(why, "within"))
    return error_timeout;
  return error_base;
}

/* Raises the engine's last error for `err`; returns NULL. */
static PyObject *raise_engine(EngineObject *self, int err)
{
  const char *why = self->engine ? gs_engine_error(self->engine) : "";
  char text[1024];

  if (!why || !why[0])
    why = gs_engine_strerror(err);
  snprintf(text, sizeof(text), "%s", why);
  PyErr_SetString(error_class(err, text), text);
  return NULL;
}

static bool check_open(EngineObject *self, bool want_started)
{
  if (!self->engine) {
    PyErr_SetString(error_base, "the engine is closed");
    return false;
  }
  if (want_started && !self->started) {
    PyErr_SetString(error_base, "the engine has not started (call start() first)");
    return false;
  }
  return true;
}

/* ---- Buffer: pack memory with its engine alive ------------------------ */

typedef struct {
  PyObject_HEAD PyObject *owner; /* the EngineObject */
  void *ptr;
  Py_ssize_t len;
  bool on_device; /* GPU memory: __cuda_array_interface__, not the buffer protocol */
} BufferObject;

static int buffer_get(PyObject *obj, Py_buffer *view, int flags)
{
  BufferObject *b = (BufferObject *)obj;

  if (b->on_device) {
    PyErr_SetString(PyExc_BufferError,
                    "GPU memory: use __cuda_array_interface__ (torch.as_tensor(b, device=...))");
    view->obj = NULL;
    return -1;
  }
  return PyBuffer_FillInfo(view, obj, b->ptr, b->len, 0, flags);
}

/* Numba's CUDA array interface (version 3), which torch.as_tensor reads:
 * a flat float32 array; "stream": None, since the engine queues its work
 * on the framework's own stream. */
static PyObject *buffer_cuda_interface(BufferObject *b, void *unused)
{
  (void)unused;
  if (!b->on_device) {
    PyErr_SetString(PyExc_AttributeError, "host memory: use the buffer protocol");
    return NULL;
  }
  return Py_BuildValue("{s:(n),s:s,s:(NO),s:i,s:O}", "shape", b->len / (Py_ssize_t)sizeof(float),
                       "typestr", "<f4", "data", PyLong_FromVoidPtr(b->ptr), Py_False, "version", 3,
                       "stream", Py_None);
}

static PyGetSetDef buffer_getset[] = {
    {"__cuda_array_interface__", (getter)buffer_cuda_interface, NULL,
     "the GPU memory, for torch.as_tensor", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static void buffer_dealloc(BufferObject *b)
{
  Py_XDECREF(b->owner);
  gs_py_free_object((PyObject *)b);
}

static PyObject *buffer_address(BufferObject *b, PyObject *unused)
{
  (void)unused;
  return PyLong_FromVoidPtr(b->ptr);
}

static PyMethodDef buffer_methods[] = {
    {"address", (PyCFunction)buffer_address, METH_NOARGS, "the memory's address"},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot buffer_slots[] = {
    {Py_tp_doc, "float32 pack memory (params or grads of one parameter); keeps its engine alive"},
    {Py_tp_dealloc, buffer_dealloc},
    {Py_bf_getbuffer, buffer_get},
    {Py_tp_methods, buffer_methods},
    {Py_tp_getset, buffer_getset},
    {0, NULL},
};

static PyType_Spec buffer_spec = {
    .name = "gradsync._engine.Buffer",
    .basicsize = sizeof(BufferObject),
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = buffer_slots,
};

static PyTypeObject *BufferType;     /* made from buffer_spec at import */
static PyTypeObject *StepResultType; /* step_result.c's, made at import */

static PyObject *buffer_new(EngineObject *owner, void *ptr, Py_ssize_t len)
{
  BufferObject *b = PyObject_New(BufferObject, BufferType);

  if (!b)
    return NULL;
  Py_INCREF((PyObject *)owner);
  b->owner = (PyObject *)owner;
  b->ptr = ptr;
  b->len = len;
  b->on_device = owner->on_device;
  return (PyObject *)b;
}

/* ---- configuration from keyword arguments ---------------------------- */

static int copy_str(PyObject *v, char *out, size_t len, const char *key)
{
  const char *s = utf8(v);

  if (!s)
    return -1;
  if (strlen(s) >= len) {
    PyErr_Format(PyExc_ValueError, "%s: '%s' is longer than %zu bytes", key, s, len - 1);
    return -1;
  }
  snprintf(out, len, "%s", s);
  return 0;
}

/* Seconds (a number) into milliseconds. */
static int seconds_ms(PyObject *v, uint64_t *ms, const char *key)
{
  double s = PyFloat_AsDouble(v);

  if (s == -1.0 && PyErr_Occurred())
    return -1;
  if (!(s > 0) || s > 1e9) {
    PyErr_Format(PyExc_ValueError, "%s must be a positive number of seconds", key);
    return -1;
  }
  *ms = (uint64_t)(s * 1000.0 + 0.5);
  return 0;
}

static int set_u64(PyObject *v, uint64_t *out)
{
  unsigned long long x = PyLong_AsUnsignedLongLong(v);

  if (x == (unsigned long long)-1 && PyErr_Occurred())
    return -1;
  *out = x;
  return 0;
}

static int set_float(PyObject *v, float *out)
{
  double x = PyFloat_AsDouble(v);

  if (x == -1.0 && PyErr_Occurred())
    return -1;
  *out = (float)x;
  return 0;
}

/* "host:port" (or a node agent's "unix:/path") into the coordinator's address. */
static int set_coordinator(PyObject *v, gs_engine_coord_t *c)
{
  const char *s = utf8(v), *colon;
  char *end;
  long port;
  size_t n;

  if (!s)
    return -1;
  if (!strncmp(s, "unix:", 5)) { /* a node agent's socket (gradsync-relay) */
    if (s[5] != '/' || strlen(s) >= sizeof(c->host) || strlen(s) - 5 >= 108) {
      PyErr_Format(PyExc_ValueError, "coordinator: expected unix:/absolute/path, got '%s'", s);
      return -1;
    }
    snprintf(c->host, sizeof(c->host), "%s", s);
    c->port = 0;
    return 0;
  }
  colon = strrchr(s, ':');
  port = colon ? strtol(colon + 1, &end, 10) : 0;
  if (!colon || !colon[1] || *end || port < 1 || port > 65535) {
    PyErr_Format(PyExc_ValueError, "coordinator: expected HOST:PORT, got '%s'", s);
    return -1;
  }
  n = (size_t)(colon - s);
  if (n >= 2 && s[0] == '[' && s[n - 1] == ']') {
    s++;
    n -= 2;
  }
  if (n == 0 || n >= sizeof(c->host)) {
    PyErr_Format(PyExc_ValueError, "coordinator: bad host in '%s'", utf8(v));
    return -1;
  }
  memcpy(c->host, s, n);
  c->host[n] = '\0';
  c->port = (uint16_t)port;
  return 0;
}

/* The string options gs_engine_new copies, one row each: the config's
 * pointer borrows the Python string until then. */
#define SAT(member) offsetof(gs_engine_config_t, member)
static const struct {
  const char *key;
  size_t off; /* of a const char * */
} string_options[] = {
    {"job", SAT(coord.job)},         {"token", SAT(coord.token)},
    {"tls_ca", SAT(coord.tls_ca)},   {"tls_cert", SAT(coord.tls_cert)},
    {"tls_key", SAT(coord.tls_key)}, {"checkpoint_dir", SAT(checkpoint_dir)},
};
#undef SAT
#define N_STRING_OPTIONS (sizeof(string_options) / sizeof(string_options[0]))

/* The Python strings the config borrows, by string_options row. */
typedef struct {
  PyObject *str[N_STRING_OPTIONS];
} borrowed_t;

/* The options that map straight onto a config field: one row each. */
typedef enum { OPT_STRBUF, OPT_U64, OPT_FLOAT, OPT_SECONDS, OPT_BOOL } opt_kind_t;

#define AT(member) offsetof(gs_engine_config_t, member), sizeof(((gs_engine_config_t *)0)->member)
static const struct {
  const char *key;
  opt_kind_t kind;
  size_t off, size;
} plain_options[] = {
    {"node", OPT_STRBUF, AT(node)},
    {"device", OPT_STRBUF, AT(device)},
    {"backend", OPT_STRBUF, AT(backend)},
    {"comm_iface", OPT_STRBUF, AT(comm_iface)},
    {"comm_bind", OPT_STRBUF, AT(comm_bind)},
    {"comm_advertise", OPT_STRBUF, AT(comm_advertise)},
    {"pack_threshold", OPT_U64, AT(pack_threshold)},
    {"checkpoint_every", OPT_U64, AT(checkpoint_every)},
    {"warmup_steps", OPT_U64, AT(sgd.warmup_steps)},
    {"step_size", OPT_U64, AT(sgd.step_size)},
    {"total_steps", OPT_U64, AT(sgd.total_steps)},
    {"lr", OPT_FLOAT, AT(sgd.lr)},
    {"momentum", OPT_FLOAT, AT(sgd.momentum)},
    {"weight_decay", OPT_FLOAT, AT(sgd.weight_decay)},
    {"bias_lr_mult", OPT_FLOAT, AT(sgd.bias_lr_mult)},
    {"bias_wd", OPT_FLOAT, AT(sgd.bias_wd)},
    {"warmup_factor", OPT_FLOAT, AT(sgd.warmup_factor)},
    {"gamma", OPT_FLOAT, AT(sgd.gamma)},
    {"nesterov", OPT_BOOL, AT(sgd.nesterov)},
    {"driven", OPT_BOOL, AT(driven)},
    {"zero_missing_grads", OPT_BOOL, AT(zero_missing_grads)},
    {"shard_optimizer", OPT_BOOL, AT(shard_optimizer)},
    {"join_timeout", OPT_SECONDS, AT(join_timeout_ms)},
    {"rpc_timeout", OPT_SECONDS, AT(rpc_timeout_ms)},
    {"comm_timeout", OPT_SECONDS, AT(comm_timeout_ms)},
    {"connect_timeout", OPT_SECONDS, AT(connect_timeout_ms)},
    {"coordinator_grace", OPT_SECONDS, AT(coordinator_grace_ms)},
    {"rejoin_timeout", OPT_SECONDS, AT(rejoin_timeout_ms)},
};
#undef AT

/* A plain option into its field; 1 when `key` is none of them. */
static int set_plain(gs_engine_config_t *c, const char *key, PyObject *v)
{
  for (size_t i = 0; i < sizeof(plain_options) / sizeof(plain_options[0]); i++) {
    void *at = (char *)c + plain_options[i].off;
    int t;

    if (strcmp(key, plain_options[i].key))
      continue;
    switch (plain_options[i].kind) {
    case OPT_STRBUF:
      return copy_str(v, at, plain_options[i].size, key);
    case OPT_U64:
      return set_u64(v, at);
    case OPT_FLOAT:
      return set_float(v, at);
    case OPT_SECONDS:
      return seconds_ms(v, at, key);
    case OPT_BOOL:
      t = PyObject_IsTrue(v);
      if (t < 0)
        return -1;
      *(bool *)at = t;
      return 0;
    }
  }
  return 1;
}

/* A string option parsed by the engine's own parser. */
static int set_named(PyObject *v, const char *key, int (*parse)(const char *, void *), void *out,
                     const char *expect)
{
  const char *str = utf8(v);

  if (!str)
    return -1;
  if (parse(str, out)) {
    PyErr_Format(PyExc_ValueError, "%s must be %s, not '%s'", key, expect, str);
    return -1;
  }
  return 0;
}

static int parse_reduce(const char *s, void *out)
{
  return gs_reduce_op_parse(s, out);
}

static int parse_schedule(const char *s, void *out)
{
  return gs_lr_schedule_parse(s, out);
}

static int parse_elastic_lr(const char *s, void *out)
{
  return gs_elastic_lr_parse(s, out);
}

static int parse_optimizer(const char *s, void *out)
{
  return gs_optim_kind_parse(s, out);
}

static int parse_nonfinite(const char *s, void *out)
{
  return gs_nonfinite_parse(s, out);
}

static int parse_decide(const char *s, void *out)
{
  return gs_decide_parse(s, out);
}

static int parse_grad_dtype(const char *s, void *out)
{
  return gs_grad_dtype_parse(s, out);
}

/* A count option in [lo, hi] into an int32_t or uint32_t. */
static int set_count(PyObject *v, const char *key, long lo, long hi, void *out, bool is_signed)
{
  long x = PyLong_AsLong(v);

  if (x == -1 && PyErr_Occurred())
    return -1;
  if (x < lo || x > hi) {
    PyErr_Format(PyExc_ValueError, "%s must be in %ld..%ld, not %ld", key, lo, hi, x);
    return -1;
  }
  if (is_signed)
    *(int32_t *)out = (int32_t)x;
  else
    *(uint32_t *)out = (uint32_t)x;
  return 0;
}

/* resume=True, False or "auto" (start fresh when there is no checkpoint). */
static int set_resume(gs_engine_config_t *c, PyObject *v)
{
  const char *str = PyUnicode_Check(v) ? utf8(v) : NULL;
  int t;

  if (str && !strcmp(str, "auto")) {
    c->resume = c->resume_auto = true;
    return 0;
  }
  if (str) {
    PyErr_Format(PyExc_ValueError, "resume must be True, False or 'auto', not '%s'", str);
    return -1;
  }
  t = PyObject_IsTrue(v);
  if (t < 0)
    return -1;
  c->resume = t;
  c->resume_auto = false;
  return 0;
}

/* A string option gs_engine_new copies: kept alive (in `keep`) until
 * then; 1 when `key` is none of them. */
static int set_borrowed(gs_engine_config_t *c, borrowed_t *keep, const char *key, PyObject *v)
{
  for (size_t i = 0; i < N_STRING_OPTIONS; i++) {
    const char *str;

    if (strcmp(key, string_options[i].key))
      continue;
    str = utf8(v);
    if (!str)
      return -1;
    Py_INCREF(v);
    Py_XDECREF(keep->str[i]);
    keep->str[i] = v;
    *(const char **)((char *)c + string_options[i].off) = str;
    return 0;
  }
  return 1;
}

static int set_option(gs_engine_config_t *c, borrowed_t *keep, const char *key, PyObject *v)
{
  int rc = set_plain(c, key, v);
  void *p;

  if (rc <= 0)
    return rc;
  rc = set_borrowed(c, keep, key, v);
  if (rc <= 0)
    return rc;
  if (!strcmp(key, "coordinator"))
    return set_coordinator(v, &c->coord);
  if (!strcmp(key, "reduce"))
    return set_named(v, key, parse_reduce, &c->reduce, "'sum' or 'mean'");
  if (!strcmp(key, "schedule"))
    return set_named(v, key, parse_schedule, &c->sgd.schedule, "'constant', 'step' or 'cosine'");
  if (!strcmp(key, "elastic_lr"))
    return set_named(v, key, parse_elastic_lr, &c->elastic_lr, "'keep' or 'linear'");
  if (!strcmp(key, "optimizer"))
    return set_named(v, key, parse_optimizer, &c->optim, "'sgd', 'adam', 'adamw' or 'none'");
  if (!strcmp(key, "nonfinite"))
    return set_named(v, key, parse_nonfinite, &c->nonfinite, "'stop', 'skip' or 'off'");
  if (!strcmp(key, "grad_dtype"))
    return set_named(v, key, parse_grad_dtype, &c->grad_dtype, "'fp32', 'bf16' or 'fp16'");
  if (!strcmp(key, "decide"))
    return set_named(v, key, parse_decide, &c->decide, "'now' or 'late'");
  if (!strcmp(key, "resume"))
    return set_resume(c, v);
  if (!strcmp(key, "world_size"))
    return set_count(v, key, 1, 1L << 24, &c->world_size, false);
  if (!strcmp(key, "world_min")) /* 0: a fixed world; else elastic, world_min..world_size */
    return set_count(v, key, 0, 1L << 24, &c->world_min, false);
  if (!strcmp(key, "local_rank"))
    return set_count(v, key, 0, 1L << 20, &c->local_rank, false);
  if (!strcmp(key, "rank")) { /* the launcher's number, fixed worlds: the Join asks for it */
    c->has_rank = true;
    return set_count(v, key, 0, 1L << 24, &c->rank, false);
  }
  if (!strcmp(key, "checkpoint_keep"))
    return set_count(v, key, 1, 1L << 20, &c->checkpoint_keep, false);
  if (!strcmp(key, "checkpoint_failures"))
    return set_count(v, key, 1, 1L << 20, &c->checkpoint_failures, false);
  if (!strcmp(key, "bcast_period"))
    return set_count(v, key, -1, INT32_MAX, &c->bcast_period, true);
  if (!strcmp(key, "cuda_stream")) {
    p = PyLong_AsVoidPtr(v);
    if (!p && PyErr_Occurred())
      return -1;
    c->cuda_stream = p;
    return 0;
  }
  PyErr_Format(PyExc_TypeError, "Engine() got an unexpected option '%s'", key);
  return -1;
}

/* ---- Engine ------------------------------------------------------------ */

static void engine_dealloc(EngineObject *self)
{
  if (self->engine) {
    if (self->started && !self->finished)
      gs_engine_finish(self->engine, false, "the Python engine object was released unfinished");
    gs_engine_free(self->engine);
  }
  PyMem_Free(self->numel);
  Py_XDECREF(self->checkpoint_extra);
  gs_py_free_object((PyObject *)self);
}

/* The engine's checkpoint_extra: calls the Python callable (on the
 * training thread, which may have released the GIL) for its bytes; a
 * failure is printed as unraisable and the checkpoint goes without. */
static void *checkpoint_extra(void *arg, size_t *len)
{
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject *res = PyObject_CallNoArgs((PyObject *)arg);
  void *out = NULL;
  char *data;
  Py_ssize_t n;

  *len = 0;
  if (res && PyBytes_AsStringAndSize(res, &data, &n) == 0) {
    out = malloc((size_t)n + 1);
    if (out) {
      memcpy(out, data, (size_t)n);
      *len = (size_t)n;
    }
  }
  if (PyErr_Occurred())
    PyErr_WriteUnraisable((PyObject *)arg);
  Py_XDECREF(res);
  PyGILState_Release(gil);
  return out;
}

static int engine_init(EngineObject *self, PyObject *args, PyObject *kwargs)
{
  gs_engine_config_t cfg;
  borrowed_t keep = {{NULL}};
  PyObject *key, *value;
  Py_ssize_t pos = 0;
  bool bias_wd_given = false;
  char why[256];
  int rc = -1;

  if (PyTuple_Size(args)) {
    PyErr_SetString(PyExc_TypeError, "Engine() takes keyword arguments only");
    return -1;
  }
  if (self->engine) {
    PyErr_SetString(PyExc_RuntimeError, "Engine() initialised twice");
    return -1;
  }
  gs_engine_config_defaults(&cfg);
  while (kwargs && PyDict_Next(kwargs, &pos, &key, &value)) {
    const char *k = utf8(key);

    if (k && !strcmp(k, "checkpoint_extra")) {
      if (!PyCallable_Check(value)) {
        PyErr_SetString(PyExc_TypeError, "checkpoint_extra must be a callable returning bytes");
        goto out;
      }
      Py_XDECREF(self->checkpoint_extra);
      self->checkpoint_extra = Py_NewRef(value);
      cfg.checkpoint_extra = checkpoint_extra;
      cfg.checkpoint_extra_arg = value;
      continue;
    }
    if (!k || set_option(&cfg, &keep, k, value))
      goto out;
    bias_wd_given |= !strcmp(k, "bias_wd");
  }
  if (!bias_wd_given)
    cfg.sgd.bias_wd = cfg.sgd.weight_decay;
  if (gs_sgd_config_check(&cfg.sgd, why, sizeof(why))) {
    PyErr_SetString(PyExc_ValueError, why);
    goto out;
  }
  if (!cfg.coord.port && strncmp(cfg.coord.host, "unix:", 5)) { /* unix: a node agent */
    PyErr_SetString(PyExc_ValueError, "coordinator='HOST:PORT' is required");
    goto out;
  }
  if (cfg.world_min > cfg.world_size) {
    PyErr_Format(PyExc_ValueError, "world_min (%u) is more than world_size (%u)", cfg.world_min,
                 cfg.world_size);
    goto out;
  }
  if (cfg.has_rank && (cfg.rank >= cfg.world_size || cfg.world_min)) {
    PyErr_Format(PyExc_ValueError, "rank %u: %s", cfg.rank,
                 cfg.world_min ? "an elastic job numbers its ranks at each regroup"
                               : "not below world_size");
    goto out;
  }
  cfg.term_flag = &term_flag;
  self->on_device = strncmp(cfg.device, "cuda", 4) == 0;
  self->optim = cfg.optim;
  self->engine = gs_engine_new(&cfg);
  if (!self->engine) {
    PyErr_NoMemory();
    goto out;
  }
  rc = 0;
out:
  for (size_t i = 0; i < N_STRING_OPTIONS; i++)
    Py_XDECREF(keep.str[i]);
  return rc;
}

static PyObject *engine_register(EngineObject *self, PyObject *args)
{
  const char *name;
  unsigned long long numel;
  int is_bias = 0, idx;
  uint64_t *grown;

  if (!PyArg_ParseTuple(args, "sK|p", &name, &numel, &is_bias) || !check_open(self, false))
    return NULL;
  idx = gs_engine_register(self->engine, name, numel, is_bias);
  if (idx < 0)
    return raise_engine(self, idx);
  grown = PyMem_Realloc(self->numel, ((size_t)idx + 1) * sizeof(*grown));
  if (!grown)
    return PyErr_NoMemory();
  self->numel = grown;
  self->numel[idx] = numel;
  self->nparams = (uint32_t)idx + 1;
  return PyLong_FromLong(idx);
}

static PyObject *engine_param_rule(EngineObject *self, PyObject *args)
{
  unsigned int i;
  float lr_mult, wd;
  int err;

  if (!PyArg_ParseTuple(args, "Iff", &i, &lr_mult, &wd) || !check_open(self, false))
    return NULL;
  err = gs_engine_param_rule(self->engine, i, lr_mult, wd);
  if (err)
    return raise_engine(self, err);
  Py_RETURN_NONE;
}

/* A group's hyperparameters from a torch.optim param_group dict (the keys
 * it lacks keep torch's defaults; "betas" is a pair), as doubles, the
 * Python floats torch computes with. */
static int group_from_dict(PyObject *d, gs_optim_group_t *g)
{
  static const struct {
    const char *key;
    size_t off;
  } floats[] = {
      {"lr", offsetof(gs_optim_group_t, lr)},
      {"weight_decay", offsetof(gs_optim_group_t, weight_decay)},
      {"momentum", offsetof(gs_optim_group_t, momentum)},
      {"dampening", offsetof(gs_optim_group_t, dampening)},
      {"eps", offsetof(gs_optim_group_t, eps)},
  };
  static const struct {
    const char *key;
    size_t off;
  } flags[] = {
      {"nesterov", offsetof(gs_optim_group_t, nesterov)},
      {"amsgrad", offsetof(gs_optim_group_t, amsgrad)},
      {"maximize", offsetof(gs_optim_group_t, maximize)},
  };
  PyObject *v;

  if (!PyDict_Check(d)) {
    PyErr_SetString(PyExc_TypeError, "a group is a dict (torch.optim's param_group)");
    return -1;
  }
  for (size_t i = 0; i < sizeof(floats) / sizeof(floats[0]); i++) {
    double x;

    v = PyDict_GetItemString(d, floats[i].key); /* borrowed */
    if (!v)
      continue;
    x = PyFloat_AsDouble(v); /* a float, an int, a 0-dim tensor */
    if (x == -1.0 && PyErr_Occurred())
      return -1;
    *(double *)((char *)g + floats[i].off) = x;
  }
  for (size_t i = 0; i < sizeof(flags) / sizeof(flags[0]); i++) {
    int t;

    v = PyDict_GetItemString(d, flags[i].key);
    if (!v)
      continue;
    t = PyObject_IsTrue(v);
    if (t < 0)
      return -1;
    *(bool *)((char *)g + flags[i].off) = t;
  }
  v = PyDict_GetItemString(d, "betas");
  if (v) {
    double b1, b2;

    if (!PyArg_ParseTuple(v, "dd", &b1, &b2))
      return -1;
    g->beta1 = b1;
    g->beta2 = b2;
  }
  return 0;
}

static PyObject *engine_add_group(EngineObject *self, PyObject *arg)
{
  gs_optim_group_t g;
  int idx;

  if (!check_open(self, false))
    return NULL;
  gs_optim_group_default(self->optim, &g);
  if (group_from_dict(arg, &g) < 0)
    return NULL;
  idx = gs_engine_add_group(self->engine, &g);
  if (idx < 0)
    return raise_engine(self, idx);
  return PyLong_FromLong(idx);
}

static PyObject *engine_param_group(EngineObject *self, PyObject *args)
{
  unsigned int i, group;
  int err;

  if (!PyArg_ParseTuple(args, "II", &i, &group) || !check_open(self, false))
    return NULL;
  err = gs_engine_param_group(self->engine, i, group);
  if (err)
    return raise_engine(self, err);
  Py_RETURN_NONE;
}

/* set_group(k, dict): the whole group again (a scheduler's lr), torch's
 * defaults for what the dict lacks. */
static PyObject *engine_set_group(EngineObject *self, PyObject *args)
{
  unsigned int k;
  PyObject *d;
  gs_optim_group_t g;
  int err;

  if (!PyArg_ParseTuple(args, "IO", &k, &d) || !check_open(self, false))
    return NULL;
  gs_optim_group_default(self->optim, &g);
  if (group_from_dict(d, &g) < 0)
    return NULL;
  err = gs_engine_set_group(self->engine, k, &g);
  if (err)
    return raise_engine(self, err);
  Py_RETURN_NONE;
}

/* state(i, slot) -> Buffer of parameter i's optimizer state `slot`. */
static PyObject *engine_state(EngineObject *self, PyObject *args)
{
  unsigned int i, slot;
  float *p;

  if (!PyArg_ParseTuple(args, "II", &i, &slot) || !check_open(self, true))
    return NULL;
  if (i >= self->nparams || slot >= gs_engine_state_count(self->engine)) {
    PyErr_Format(PyExc_IndexError, "no state %u of parameter %u", slot, i);
    return NULL;
  }
  p = gs_engine_state(self->engine, i, slot);
  if (!p) {
    PyErr_Format(error_base,
                 "parameter %u's optimizer state is sharded over the ranks: assemble it first "
                 "(state_assemble())",
                 i);
    return NULL;
  }
  return buffer_new(self, p, (Py_ssize_t)(self->numel[i] * sizeof(float)));
}

/* state_assemble(empty=False) and state_release(keep=False): the whole
 * sharded state on every rank (gs_engine_state_assemble). */
static PyObject *engine_state_assemble(EngineObject *self, PyObject *args)
{
  int empty = 0, err;

  if (!PyArg_ParseTuple(args, "|p", &empty) || !check_open(self, true))
    return NULL;
  Py_BEGIN_ALLOW_THREADS
  err = gs_engine_state_assemble(self->engine, empty);
  Py_END_ALLOW_THREADS
  if (err)
    return raise_engine(self, err);
  Py_RETURN_NONE;
}

static PyObject *engine_state_release(EngineObject *self, PyObject *args)
{
  int keep = 0, err;

  if (!PyArg_ParseTuple(args, "|p", &keep) || !check_open(self, true))
    return NULL;
  err = gs_engine_state_release(self->engine, keep);
  if (err)
    return raise_engine(self, err);
  Py_RETURN_NONE;
}

/* window(i) -> (first, count): parameter i's elements in this rank's shard. */
static PyObject *engine_window(EngineObject *self, PyObject *args)
{
  unsigned int i;
  uint64_t first, count;

  if (!PyArg_ParseTuple(args, "I", &i) || !check_open(self, true))
    return NULL;
  if (i >= self->nparams) {
    PyErr_Format(PyExc_IndexError, "no parameter %u", i);
    return NULL;
  }
  gs_engine_window(self->engine, i, &first, &count);
  return Py_BuildValue("KK", (unsigned long long)first, (unsigned long long)count);
}

static PyObject *engine_optim_steps(EngineObject *self, PyObject *args)
{
  unsigned long long n = 0;

  if (!PyArg_ParseTuple(args, "|K", &n) || !check_open(self, true))
    return NULL;
  if (PyTuple_Size(args) == 1)
    gs_engine_set_optim_steps(self->engine, n);
  return PyLong_FromUnsignedLongLong(gs_engine_optim_steps(self->engine));
}

static PyObject *engine_add_setting(EngineObject *self, PyObject *args)
{
  const char *name, *value;
  int err;

  if (!PyArg_ParseTuple(args, "ss", &name, &value) || !check_open(self, false))
    return NULL;
  err = gs_engine_add_setting(self->engine, name, value);
  if (err)
    return raise_engine(self, err);
  Py_RETURN_NONE;
}

/* Around a blocking engine call: lets go of the GIL, and makes SIGINT,
 * like SIGTERM, end the call's waits (Python's own handler could not run
 * until it returns); the caller raises KeyboardInterrupt after. */
typedef struct {
  PyThreadState *ts;
  struct sigaction old_int;
} blocking_t;

static void blocking_begin(blocking_t *b)
{
  struct sigaction sa = {.sa_handler = on_term};

  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &b->old_int);
  b->ts = PyEval_SaveThread();
}

/* Back with the GIL; true when SIGINT came meanwhile (it is consumed). */
static bool blocking_end(blocking_t *b)
{
  PyEval_RestoreThread(b->ts);
  sigaction(SIGINT, &b->old_int, NULL);
  if (term_flag != SIGINT)
    return false;
  term_flag = 0;
  return true;
}

/* The error of a blocking call: KeyboardInterrupt when SIGINT ended it. */
static PyObject *raise_blocking(EngineObject *self, int err, bool sigint)
{
  if (sigint) {
    PyErr_SetString(PyExc_KeyboardInterrupt, gs_engine_error(self->engine));
    return NULL;
  }
  return raise_engine(self, err);
}

static PyObject *engine_start(EngineObject *self, PyObject *unused)
{
  blocking_t b;
  bool sigint;
  int err;

  (void)unused;
  if (!check_open(self, false))
    return NULL;
  if (self->started) {
    PyErr_SetString(error_base, "start() called twice");
    return NULL;
  }
  blocking_begin(&b);
  err = gs_engine_start(self->engine);
  sigint = blocking_end(&b);
  if (err)
    return raise_blocking(self, err, sigint);
  self->started = true;
  Py_RETURN_NONE;
}

static PyObject *engine_info(EngineObject *self, PyObject *unused)
{
  (void)unused;
  if (!check_open(self, true))
    return NULL;
  gs_position_t pos;

  gs_engine_position(self->engine, &pos);
  return Py_BuildValue(
      "{s:I,s:I,s:K,s:I,s:i,s:d,s:K,s:K,s:K}", "rank", gs_engine_rank(self->engine), "world_size",
      gs_engine_world_size(self->engine), "generation",
      (unsigned long long)gs_engine_generation(self->engine), "packs",
      gs_engine_pack_count(self->engine), "bcast_period", gs_engine_bcast_period(self->engine),
      "lr_factor", (double)gs_engine_lr_factor(self->engine), "step", (unsigned long long)pos.step,
      "epoch", (unsigned long long)pos.epoch, "sample",
      (unsigned long long)(pos.sample == GS_POSITION_SAMPLE_UNKNOWN ? 0 : pos.sample));
}

static PyObject *param_or_grad(EngineObject *self, PyObject *args, bool grad)
{
  unsigned int i;
  float *p;

  if (!PyArg_ParseTuple(args, "I", &i) || !check_open(self, true))
    return NULL;
  if (i >= self->nparams) {
    PyErr_Format(PyExc_IndexError, "no parameter %u (%u registered)", i, self->nparams);
    return NULL;
  }
  p = grad ? gs_engine_grad(self->engine, i) : gs_engine_param(self->engine, i);
  if (!p)
    return raise_engine(self, -1);
  return buffer_new(self, p, (Py_ssize_t)(self->numel[i] * sizeof(float)));
}

/* verdict() -> Buffer of one float32: not 0 once this step's sums were
 * found not all finite (gs_engine_verdict_at). */
static PyObject *engine_verdict(EngineObject *self, PyObject *unused)
{
  float *v;

  (void)unused;
  if (!check_open(self, true))
    return NULL;
  v = gs_engine_verdict_at(self->engine);
  if (!v)
    return raise_engine(self, -1);
  return buffer_new(self, v, (Py_ssize_t)sizeof(float));
}

static PyObject *engine_param(EngineObject *self, PyObject *args)
{
  return param_or_grad(self, args, false);
}

static PyObject *engine_grad(EngineObject *self, PyObject *args)
{
  return param_or_grad(self, args, true);
}

static PyObject *engine_param_pack(EngineObject *self, PyObject *args)
{
  unsigned int i;

  if (!PyArg_ParseTuple(args, "I", &i) || !check_open(self, true))
    return NULL;
  return PyLong_FromUnsignedLong(gs_engine_param_pack(self->engine, i));
}

/* A position's sample: None when the engine does not know it (a
 * checkpoint written before it was stored). */
static PyObject *sample_value(uint64_t sample)
{
  if (sample == GS_POSITION_SAMPLE_UNKNOWN)
    Py_RETURN_NONE;
  return PyLong_FromUnsignedLongLong(sample);
}

/* (step, epoch, sample) */
static PyObject *position_value(const gs_position_t *pos)
{
  return Py_BuildValue("(KKN)", (unsigned long long)pos->step, (unsigned long long)pos->epoch,
                       sample_value(pos->sample));
}

/* (step, epoch[, sample]) arguments into a position. */
static bool parse_position(PyObject *args, gs_position_t *pos)
{
  unsigned long long step = 0, epoch = 0, sample = 0;
  bool ok = PyArg_ParseTuple(args, "KK|K", &step, &epoch, &sample);

  *pos = (gs_position_t){step, epoch, 0, sample};
  return ok;
}

static PyObject *engine_sync_initial(EngineObject *self, PyObject *unused)
{
  gs_position_t pos = {0};
  blocking_t b;
  bool sigint;
  int err;

  (void)unused;
  if (!check_open(self, true))
    return NULL;
  blocking_begin(&b);
  err = gs_engine_sync_initial(self->engine, &pos);
  sigint = blocking_end(&b);
  if (err)
    return raise_blocking(self, err, sigint);
  return position_value(&pos);
}

static PyObject *engine_set_loss(EngineObject *self, PyObject *args)
{
  double loss;

  if (!PyArg_ParseTuple(args, "d", &loss) || !check_open(self, true))
    return NULL;
  gs_engine_set_loss(self->engine, (float)loss);
  Py_RETURN_NONE;
}

/* Called from autograd's hooks: cheap, and never blocks (a blocking
 * backend hands the pack to the comm thread). */
static PyObject *engine_grad_ready(EngineObject *self, PyObject *arg)
{
  unsigned long i = PyLong_AsUnsignedLong(arg);

  if (i == (unsigned long)-1 && PyErr_Occurred())
    return NULL;
  if (!self->engine || i >= self->nparams) {
    PyErr_Format(PyExc_IndexError, "no parameter %lu", i);
    return NULL;
  }
  gs_engine_grad_ready(self->engine, (uint32_t)i);
  Py_RETURN_NONE;
}

/* end_step(loss_at=0): with loss_at, the address of the step's loss (one
 * float32 in device memory, a tensor's data_ptr(); see
 * gs_engine_set_loss_at) first. The step's decisions as a StepResult. */
static PyObject *engine_end_step(EngineObject *self, PyObject *args)
{
  PyObject *at = NULL;
  void *loss = NULL;
  gs_step_result_t r;
  int err;

  if (!PyArg_ParseTuple(args, "|O", &at) || (at && !parse_address(at, &loss)) ||
      !check_open(self, true))
    return NULL;
  if (loss)
    gs_engine_set_loss_at(self->engine, loss);
  memset(&r, 0, sizeof(r));
  Py_BEGIN_ALLOW_THREADS
  err = gs_engine_end_step(self->engine, &r);
  Py_END_ALLOW_THREADS
  if (err && !r.nonfinite) /* a non-finite step is a stop every rank takes, not an error */
    return raise_engine(self, err);
  return gs_py_step_result_new(StepResultType, self->engine, &r);
}

/* drain() -> StepResult of the step still in flight (decide='late': the
 * last step's), or None when nothing was: what became of it. A stop at a
 * non-finite step is a result, as end_step's. */
static PyObject *engine_drain(EngineObject *self, PyObject *unused)
{
  gs_step_result_t r;
  int err;

  (void)unused;
  if (!check_open(self, true))
    return NULL;
  Py_BEGIN_ALLOW_THREADS
  err = gs_engine_drain(self->engine, &r);
  Py_END_ALLOW_THREADS
  if (err && !r.nonfinite)
    return raise_engine(self, err);
  if (!err && !r.stop && !r.skipped && !r.nonfinite)
    Py_RETURN_NONE;
  return gs_py_step_result_new(StepResultType, self->engine, &r);
}

/* forward(batch): the model's forward starts (the compute phase) with a
 * batch of `batch` examples per rank (driven steps: the position and
 * samples/s). Cheap: called before every forward. */
static PyObject *engine_forward(EngineObject *self, PyObject *arg)
{
  unsigned long long batch = PyLong_AsUnsignedLongLong(arg);

  if ((batch == (unsigned long long)-1 && PyErr_Occurred()) || !check_open(self, true))
    return NULL;
  gs_engine_set_batch(self->engine, batch);
  gs_engine_phase(self->engine, GS_PHASE_COMPUTE);
  Py_RETURN_NONE;
}

static PyObject *engine_set_epoch(EngineObject *self, PyObject *arg)
{
  unsigned long long epoch = PyLong_AsUnsignedLongLong(arg);

  if ((epoch == (unsigned long long)-1 && PyErr_Occurred()) || !check_open(self, true))
    return NULL;
  gs_engine_set_epoch(self->engine, epoch);
  Py_RETURN_NONE;
}

/* skip_step_at(addr), scale_step_at(addr): one float32 in device memory
 * (a tensor's data_ptr(), kept alive by the caller until end_step),
 * handed to `set`. */
static PyObject *step_input_at(EngineObject *self, PyObject *arg,
                               void (*set)(gs_engine_t *, const float *))
{
  void *at;

  if (!parse_address(arg, &at) || !check_open(self, true))
    return NULL;
  set(self->engine, at);
  Py_RETURN_NONE;
}

static PyObject *engine_skip_step_at(EngineObject *self, PyObject *arg)
{
  return step_input_at(self, arg, gs_engine_skip_step_at);
}

static PyObject *engine_scale_step_at(EngineObject *self, PyObject *arg)
{
  return step_input_at(self, arg, gs_engine_scale_step_at);
}

/* sum_at(addr, n) and broadcast_at(addr, nbytes, root): device memory (a
 * contiguous tensor's data_ptr()) summed or broadcast in place. */
static PyObject *engine_sum_at(EngineObject *self, PyObject *args)
{
  PyObject *at;
  unsigned long long n;
  void *buf;
  int err;

  if (!PyArg_ParseTuple(args, "OK", &at, &n) || !parse_address(at, &buf) || !check_open(self, true))
    return NULL;
  Py_BEGIN_ALLOW_THREADS
  err = gs_engine_allreduce_sum_on_device(self->engine, buf, (size_t)n);
  Py_END_ALLOW_THREADS
  if (err)
    return raise_engine(self, err);
  Py_RETURN_NONE;
}

static PyObject *engine_broadcast_at(EngineObject *self, PyObject *args)
{
  PyObject *at;
  unsigned long long bytes;
  unsigned int root;
  void *buf;
  int err;

  if (!PyArg_ParseTuple(args, "OKI", &at, &bytes, &root) || !parse_address(at, &buf) ||
      !check_open(self, true))
    return NULL;
  Py_BEGIN_ALLOW_THREADS
  err = gs_engine_broadcast_on_device(self->engine, buf, (size_t)bytes, root);
  Py_END_ALLOW_THREADS
  if (err)
    return raise_engine(self, err);
  Py_RETURN_NONE;
}

/* The front end's bytes of the checkpoint resumed (rank 0), or None. */
static PyObject *engine_resumed_extra(EngineObject *self, PyObject *unused)
{
  const void *data;
  size_t len;

  (void)unused;
  if (!check_open(self, true))
    return NULL;
  data = gs_engine_resumed_extra(self->engine, &len);
  if (!data)
    Py_RETURN_NONE;
  return PyBytes_FromStringAndSize(data, (Py_ssize_t)len);
}

/* synchronize(scale=True, verdict=True, loss_at=0) -> (nonfinite, regrouped):
 * with loss_at the step's loss first (as end_step's); `nonfinite` is the
 * sums' verdict when asked for (the host then waits for the device), else
 * None. */
static PyObject *engine_synchronize(EngineObject *self, PyObject *args)
{
  int scale = 1, verdict = 1, err;
  PyObject *at = NULL;
  void *loss = NULL;
  gs_sync_result_t r;

  if (!PyArg_ParseTuple(args, "|ppO", &scale, &verdict, &at) || (at && !parse_address(at, &loss)) ||
      !check_open(self, true))
    return NULL;
  if (loss)
    gs_engine_set_loss_at(self->engine, loss);
  Py_BEGIN_ALLOW_THREADS
  err = gs_engine_synchronize(self->engine, scale, verdict ? &r : NULL);
  Py_END_ALLOW_THREADS
  if (err)
    return raise_engine(self, err);
  if (!verdict)
    r = (gs_sync_result_t){.regrouped = gs_engine_step_regrouped(self->engine)};
  return Py_BuildValue("(OO)",
                       !verdict      ? Py_None
                       : r.nonfinite ? Py_True
                                     : Py_False,
                       r.regrouped ? Py_True : Py_False);
}

static PyObject *engine_skip_step(EngineObject *self, PyObject *Py_UNUSED(ignored))
{
  if (!check_open(self, true))
    return NULL;
  gs_engine_skip_step(self->engine);
  Py_RETURN_NONE;
}

/* Sums a writable float32 buffer over the ranks, in place. */
static PyObject *engine_allreduce_sum(EngineObject *self, PyObject *arg)
{
  Py_buffer view;
  int err;

  if (!check_open(self, true) ||
      PyObject_GetBuffer(arg, &view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS))
    return NULL;
  if (view.len % (Py_ssize_t)sizeof(float)) {
    PyBuffer_Release(&view);
    PyErr_SetString(PyExc_ValueError, "allreduce_sum needs float32 memory");
    return NULL;
  }
  Py_BEGIN_ALLOW_THREADS
  err = gs_engine_allreduce_sum(self->engine, view.buf, (size_t)view.len / sizeof(float));
  Py_END_ALLOW_THREADS
  PyBuffer_Release(&view);
  if (err)
    return raise_engine(self, err);
  Py_RETURN_NONE;
}

/* broadcast(buffer, root): a writable buffer becomes rank root's, in place. */
static PyObject *engine_broadcast(EngineObject *self, PyObject *args)
{
  Py_buffer view;
  unsigned int root;
  int err;

  if (!PyArg_ParseTuple(args, "w*I", &view, &root))
    return NULL;
  if (!check_open(self, true)) {
    PyBuffer_Release(&view);
    return NULL;
  }
  Py_BEGIN_ALLOW_THREADS
  err = gs_engine_broadcast(self->engine, view.buf, (size_t)view.len, root);
  Py_END_ALLOW_THREADS
  PyBuffer_Release(&view);
  if (err)
    return raise_engine(self, err);
  Py_RETURN_NONE;
}

static PyObject *engine_checkpoint(EngineObject *self, PyObject *args)
{
  gs_position_t pos;
  int err;

  if (!parse_position(args, &pos) || !check_open(self, true))
    return NULL;
  Py_BEGIN_ALLOW_THREADS
  err = gs_engine_checkpoint(self->engine, &pos);
  Py_END_ALLOW_THREADS
  if (err)
    return raise_engine(self, err);
  Py_RETURN_NONE;
}

static PyObject *engine_finish(EngineObject *self, PyObject *args)
{
  int finished = 1;
  const char *reason = "";

  if (!PyArg_ParseTuple(args, "|ps", &finished, &reason) || !check_open(self, false))
    return NULL;
  if (self->started && !self->finished) {
    Py_BEGIN_ALLOW_THREADS
    gs_engine_finish(self->engine, finished, reason);
    Py_END_ALLOW_THREADS
  }
  self->finished = true;
  Py_RETURN_NONE;
}

static PyObject *engine_error(EngineObject *self, PyObject *unused)
{
  (void)unused;
  return PyUnicode_FromString(self->engine ? gs_engine_error(self->engine) : "");
}

static PyMethodDef engine_methods[] = {
    {"register", (PyCFunction)engine_register, METH_VARARGS,
     "register(name, numel, is_bias=False) -> index: a float32 parameter, in forward order"},
    {"param_rule", (PyCFunction)engine_param_rule, METH_VARARGS,
     "param_rule(i, lr_mult, weight_decay): parameter i's own, before start"},
    {"add_group", (PyCFunction)engine_add_group, METH_O,
     "add_group(dict) -> index: an optimizer parameter group (torch's keys), before start"},
    {"param_group", (PyCFunction)engine_param_group, METH_VARARGS,
     "param_group(i, group): parameter i's group, before start"},
    {"set_group", (PyCFunction)engine_set_group, METH_VARARGS,
     "set_group(k, dict): group k's hyperparameters from the next step on"},
    {"state", (PyCFunction)engine_state, METH_VARARGS,
     "state(i, slot) -> Buffer of parameter i's optimizer state (SGD: 0 momentum; Adam: 0 "
     "exp_avg, 1 exp_avg_sq, 2 max_exp_avg_sq)"},
    {"state_assemble", (PyCFunction)engine_state_assemble, METH_VARARGS,
     "state_assemble(empty=False): with shard_optimizer, every parameter's optimizer state on "
     "every rank (every rank calls it) until state_release; empty: zeroed, to load into"},
    {"state_release", (PyCFunction)engine_state_release, METH_VARARGS,
     "state_release(keep=False): frees the assembled state; keep: this rank's shard of it kept"},
    {"window", (PyCFunction)engine_window, METH_VARARGS,
     "window(i) -> (first, count): parameter i's elements in this rank's shard"},
    {"optim_steps", (PyCFunction)engine_optim_steps, METH_VARARGS,
     "optim_steps([n]) -> the updates applied (set to n first when given)"},
    {"add_setting", (PyCFunction)engine_add_setting, METH_VARARGS,
     "add_setting(name, value): a value every rank must share, compared at Join"},
    {"start", (PyCFunction)engine_start, METH_NOARGS,
     "joins the job, agrees on the pack list, connects the ranks (blocks)"},
    {"info", (PyCFunction)engine_info, METH_NOARGS,
     "{'rank', 'world_size', 'generation', 'packs', 'bcast_period', 'lr_factor', 'step', "
     "'epoch', 'sample'} once started"},
    {"param", (PyCFunction)engine_param, METH_VARARGS, "param(i) -> Buffer of its pack memory"},
    {"grad", (PyCFunction)engine_grad, METH_VARARGS, "grad(i) -> Buffer of its gradient memory"},
    {"verdict", (PyCFunction)engine_verdict, METH_NOARGS,
     "verdict() -> Buffer of one float32 in device memory: not 0 once this step's summed "
     "gradients were found not all finite"},
    {"param_pack", (PyCFunction)engine_param_pack, METH_VARARGS,
     "param_pack(i) -> the pack parameter i lives in"},
    {"sync_initial", (PyCFunction)engine_sync_initial, METH_NOARGS,
     "every rank takes rank 0's params (or its checkpoint with resume, or a running elastic "
     "job's state): (step, epoch, sample), sample None when unknown"},
    {"set_loss", (PyCFunction)engine_set_loss, METH_VARARGS,
     "set_loss(loss): the step's loss, before the last pack's last gradient"},
    {"grad_ready", (PyCFunction)engine_grad_ready, METH_O, "grad_ready(i): gradient i is final"},
    {"forward", (PyCFunction)engine_forward, METH_O,
     "forward(batch): a forward of `batch` examples per rank starts (driven steps)"},
    {"set_epoch", (PyCFunction)engine_set_epoch, METH_O,
     "set_epoch(epoch): a new epoch starts at sample 0 (driven steps)"},
    {"end_step", (PyCFunction)engine_end_step, METH_VARARGS,
     "end_step(loss_at=0) -> StepResult: with the loss's address first (one float32 in device "
     "memory), waits for the allreduces and applies the update"},
    {"drain", (PyCFunction)engine_drain, METH_NOARGS,
     "drain() -> StepResult or None: decides the step still in flight (decide='late')"},
    {"skip_step_at", (PyCFunction)engine_skip_step_at, METH_O,
     "skip_step_at(addr): the update is skipped when the float32 there is not 0 (a loss "
     "scaler's found_inf), read by the device"},
    {"scale_step_at", (PyCFunction)engine_scale_step_at, METH_O,
     "scale_step_at(addr): the update's gradients times the float32 there (clipping), read by "
     "the device"},
    {"sum_at", (PyCFunction)engine_sum_at, METH_VARARGS,
     "sum_at(addr, n): n float32 of device memory summed over the ranks, in place"},
    {"broadcast_at", (PyCFunction)engine_broadcast_at, METH_VARARGS,
     "broadcast_at(addr, nbytes, root): device memory becomes rank root's, in place"},
    {"resumed_extra", (PyCFunction)engine_resumed_extra, METH_NOARGS,
     "the checkpoint_extra bytes of the checkpoint resumed (rank 0), or None"},
    {"synchronize", (PyCFunction)engine_synchronize, METH_VARARGS,
     "synchronize(scale=True, verdict=True, loss_at=0) -> (nonfinite or None, regrouped): the "
     "step's allreduces done and checked, the update not applied; with scale the sums become the "
     "gradients the update uses (the mean's 1/world applied); the verdict (a wait for the "
     "device) only when asked"},
    {"skip_step", (PyCFunction)engine_skip_step, METH_NOARGS,
     "skip_step(): this step's update is not applied (a loss scaler's verdict, the same on "
     "every rank)"},
    {"broadcast", (PyCFunction)engine_broadcast, METH_VARARGS,
     "broadcast(buffer, root): the writable buffer becomes rank root's, in place; WorldChanged "
     "when an elastic job regrouped meanwhile"},
    {"allreduce_sum", (PyCFunction)engine_allreduce_sum, METH_O,
     "allreduce_sum(buffer): sums float32 memory over the ranks, in place; WorldChanged when an "
     "elastic job regrouped meanwhile (sum again)"},
    {"checkpoint", (PyCFunction)engine_checkpoint, METH_VARARGS,
     "checkpoint(step, epoch, sample=0): rank 0 writes one (in the background)"},
    {"finish", (PyCFunction)engine_finish, METH_VARARGS,
     "finish(finished=True, reason=''): leaves the job"},
    {"error", (PyCFunction)engine_error, METH_NOARGS, "the engine's last error in words"},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot engine_slots[] = {
    {Py_tp_doc, "libgradsync's sync engine (gradsync/engine.h); keyword options as its config"},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_init, engine_init},
    {Py_tp_dealloc, engine_dealloc},
    {Py_tp_methods, engine_methods},
    {0, NULL},
};

static PyType_Spec engine_spec = {
    .name = "gradsync._engine.Engine",
    .basicsize = sizeof(EngineObject),
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = engine_slots,
};

/* ---- module ------------------------------------------------------------ */

/* Our SIGTERM handler, unless the program installed its own: a SIGTERM
 * (scancel, pod deletion) then stops every rank at the same step. */
static PyObject *install_sigterm(PyObject *mod, PyObject *unused)
{
  struct sigaction old, sa = {.sa_handler = on_term};

  (void)mod;
  (void)unused;
  if (sigaction(SIGTERM, NULL, &old) == 0 && old.sa_handler == SIG_DFL) {
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    Py_RETURN_TRUE;
  }
  Py_RETURN_FALSE;
}

static PyObject *signal_received(PyObject *mod, PyObject *unused)
{
  (void)mod;
  (void)unused;
  return PyLong_FromLong(term_flag);
}

static PyMethodDef module_methods[] = {
    {"install_sigterm", install_sigterm, METH_NOARGS,
     "handle SIGTERM as a stop every rank takes at one step (when no handler is set)"},
    {"signal_received", signal_received, METH_NOARGS, "the signal that asked to stop, or 0"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, .m_name = "gradsync._engine", .m_doc = "libgradsync's engine for Python",
    .m_size = -1,          .m_methods = module_methods,
};

static int add_error(PyObject *m, PyObject **slot, const char *name, PyObject *base,
                     const char *doc)
{
  char full[64];

  snprintf(full, sizeof(full), "gradsync.%s", name);
  *slot = PyErr_NewExceptionWithDoc(full, doc, base, NULL);
  if (!*slot)
    return -1;
  Py_INCREF(*slot);
  return PyModule_AddObject(m, name, *slot);
}

PyMODINIT_FUNC PyInit__engine(void)
{
  PyObject *m, *engine_type = PyType_FromSpec(&engine_spec);

  BufferType = (PyTypeObject *)PyType_FromSpec(&buffer_spec);
  StepResultType = gs_py_step_result_type();
  if (!engine_type || !BufferType || !StepResultType)
    return NULL;
  m = PyModule_Create(&module_def);
  if (!m)
    return NULL;
  Py_INCREF((PyObject *)BufferType);
  Py_INCREF((PyObject *)StepResultType);
  if (PyModule_AddObject(m, "Engine", engine_type) ||
      PyModule_AddObject(m, "Buffer", (PyObject *)BufferType) ||
      PyModule_AddObject(m, "StepResult", (PyObject *)StepResultType) ||
      add_error(m, &error_base, "Error", PyExc_RuntimeError, "a gradsync engine error") ||
      add_error(m, &error_peer_lost, "PeerLost", error_base,
                "another rank was lost, or the coordinator aborted the job") ||
      add_error(m, &error_model_mismatch, "ModelMismatch", error_base,
                "the ranks' models differ") ||
      add_error(m, &error_timeout, "Timeout", error_base,
                "a wait (join, coordinator, collective) timed out") ||
      add_error(m, &error_interrupted, "Interrupted", error_base,
                "a signal (SIGTERM, SIGINT) ended a wait") ||
      add_error(m, &error_world_changed, "WorldChanged", error_base,
                "an elastic job regrouped during a sum: compute this rank's share again over the "
                "new world and sum again")) {
    Py_DECREF(m);
    return NULL;
  }
  return m;
}
