/* gradsync._engine.StepResult: what a step decided, as end_step returns
 * it. One object per step holding the engine's gs_step_result_t and this
 * rank's place; its attributes read the struct's fields directly
 * (PyMemberDef), so making one costs an allocation and a copy, and a
 * field nobody reads costs nothing. The front end sets the few it
 * decides itself (world_changed, dropped, the position after a regroup). */
#define PY_SSIZE_T_CLEAN
#define Py_LIMITED_API 0x030B0000
#include <Python.h>
#include <structmember.h>

#include <stddef.h>
#include <string.h>

#include "step_result.h"

typedef struct {
  PyObject_HEAD gs_step_result_t r;
  /* This rank's place and position from now on, and the engine's lr
   * factor (what a front end's own optimizer scales its lr by). */
  unsigned int rank, world_size;
  unsigned long long step, epoch, sample;
  float lr_factor;
  /* Set by the front end: the world changed (a regroup, or one met while
   * re-syncing buffers), and the step in flight was dropped. */
  bool world_changed, dropped;
} StepResultObject;

#define R(field) offsetof(StepResultObject, r.field)
#define S(field) offsetof(StepResultObject, field)
static PyMemberDef members[] = {
    {"stop", T_BOOL, R(stop), READONLY, "stop after this step (every rank does)"},
    {"stop_reason", T_STRING_INPLACE, R(stop_reason), READONLY, "why, when stop"},
    {"bcast_period", T_INT, R(bcast_period), READONLY, "the broadcast period from the next step"},
    {"period_changed", T_BOOL, R(period_changed), READONLY, "the coordinator changed it now"},
    {"lr_scale", T_FLOAT, R(lr_scale), READONLY,
     "the operator's lr scale: every group's lr times it from the next step"},
    {"lr_scale_changed", T_BOOL, R(lr_scale_changed), READONLY, "the operator changed it now"},
    {"broadcast", T_BOOL, R(broadcast), READONLY, "rank 0's params were broadcast after it"},
    {"checkpoint", T_BOOL, R(checkpoint), READONLY, "a checkpoint was taken after it"},
    {"nonfinite", T_BOOL, R(nonfinite), READONLY,
     "a loss or the summed gradients held NaN or an infinity: the step was not applied"},
    {"skipped", T_BOOL, R(skipped), READONLY, "the step was skipped on every rank"},
    {"comm_wait_ms", T_DOUBLE, R(comm_wait_ms), READONLY, "waiting for the allreduces"},
    {"optimizer_ms", T_DOUBLE, R(optimizer_ms), READONLY, "queueing the update"},
    {"detect_ms", T_DOUBLE, R(detect_ms), READONLY, "world_changed: to noticing the loss"},
    {"regroup_ms", T_DOUBLE, R(regroup_ms), READONLY, "world_changed: to the state shared"},
    {"device_syncs", T_UINT, R(device_syncs), READONLY,
     "times the training thread waited for the device since the last step"},
    {"device_reads", T_UINT, R(device_reads), READONLY,
     "device-to-host copies it waited for since the last step"},
    {"comm_waits", T_UINT, R(comm_waits), READONLY,
     "times it waited for the comm thread since the last step"},
    {"state_bytes", T_ULONGLONG, R(state_bytes), READONLY,
     "the optimizer state this rank holds, in bytes (with shard_optimizer: its shard's)"},
    {"regrouped", T_BOOL, R(regrouped), READONLY, "an elastic regroup happened in this step"},
    {"world_changed", T_BOOL, S(world_changed), 0,
     "elastic: the world changed (a rank was lost, or new ones joined)"},
    {"dropped", T_BOOL, S(dropped), 0,
     "world_changed: the step was discarded with its gradients (trained again)"},
    {"rank", T_UINT, S(rank), 0, "this rank's place from now on"},
    {"world_size", T_UINT, S(world_size), 0, "the world from now on"},
    {"step", T_ULONGLONG, S(step), 0, "steps completed: where training goes on"},
    {"epoch", T_ULONGLONG, S(epoch), 0, "the epoch"},
    {"sample", T_ULONGLONG, S(sample), 0, "examples of the epoch trained on over all ranks"},
    {"lr_factor", T_FLOAT, S(lr_factor), READONLY,
     "the engine's lr factor (operator's scale, elastic_lr) for an optimizer of its own"},
    {NULL, 0, 0, 0, NULL},
};
#undef R
#undef S

/* {name: value} of every field: vars(result), as of the dataclass it
 * replaces. */
static PyObject *step_result_dict(PyObject *self, void *unused)
{
  PyObject *d = PyDict_New();

  (void)unused;
  for (const PyMemberDef *m = members; d && m->name; m++) {
    PyObject *v = PyObject_GetAttrString(self, m->name);

    if (!v || PyDict_SetItemString(d, m->name, v)) {
      Py_XDECREF(v);
      Py_CLEAR(d);
      break;
    }
    Py_DECREF(v);
  }
  return d;
}

static PyGetSetDef getset[] = {
    {"__dict__", step_result_dict, NULL, "every field by name (a new dict)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

/* StepResult(stop=False, ...): every field by name. */
static PyObject *step_result_repr(PyObject *self)
{
  PyObject *parts = PyList_New(0), *sep = NULL, *body = NULL, *out = NULL;

  for (const PyMemberDef *m = members; parts && m->name; m++) {
    PyObject *v = PyObject_GetAttrString(self, m->name);
    PyObject *item = v ? PyUnicode_FromFormat("%s=%R", m->name, v) : NULL;

    Py_XDECREF(v);
    if (!item || PyList_Append(parts, item)) {
      Py_XDECREF(item);
      goto out;
    }
    Py_DECREF(item);
  }
  sep = PyUnicode_FromString(", ");
  body = sep && parts ? PyUnicode_Join(sep, parts) : NULL;
  if (body)
    out = PyUnicode_FromFormat("StepResult(%U)", body);
out:
  Py_XDECREF(parts);
  Py_XDECREF(sep);
  Py_XDECREF(body);
  return out;
}

static PyType_Slot slots[] = {
    {Py_tp_doc, "what a step decided, the same on every rank (but rank)"},
    {Py_tp_members, members},
    {Py_tp_getset, getset},
    {Py_tp_repr, step_result_repr},
    {Py_tp_dealloc, gs_py_free_object},
    {0, NULL},
};

static PyType_Spec spec = {
    .name = "gradsync._engine.StepResult",
    .basicsize = sizeof(StepResultObject),
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = slots,
};

PyTypeObject *gs_py_step_result_type(void)
{
  return (PyTypeObject *)PyType_FromSpec(&spec);
}

PyObject *gs_py_step_result_new(PyTypeObject *type, gs_engine_t *e, const gs_step_result_t *r)
{
  allocfunc alloc = (allocfunc)PyType_GetSlot(type, Py_tp_alloc);
  StepResultObject *o = (StepResultObject *)alloc(type, 0);
  gs_position_t pos;

  if (!o)
    return NULL;
  o->r = *r;
  o->rank = gs_engine_rank(e);
  o->world_size = gs_engine_world_size(e);
  gs_engine_position(e, &pos);
  o->step = pos.step;
  o->epoch = pos.epoch;
  o->sample = pos.sample == GS_POSITION_SAMPLE_UNKNOWN ? 0 : pos.sample;
  o->lr_factor = gs_engine_lr_factor(e);
  return (PyObject *)o;
}
