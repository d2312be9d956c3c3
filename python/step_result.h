/* gradsync._engine.StepResult (step_result.c): a step's decisions. */
#ifndef GS_PY_STEP_RESULT_H
#define GS_PY_STEP_RESULT_H

#include <gradsync/engine.h>

/* Frees an object of one of the module's heap types (which hold a
 * reference to their type): their tp_dealloc, or its last step. */
static inline void gs_py_free_object(PyObject *o)
{
  PyTypeObject *type = Py_TYPE(o);
  freefunc tp_free = (freefunc)PyType_GetSlot(type, Py_tp_free);

  tp_free(o);
  Py_DECREF(type);
}

/* The type, made at import (a new reference; NULL with an exception). */
PyTypeObject *gs_py_step_result_type(void);

/* One step's result with this rank's place and position from `e`; a new
 * reference, or NULL with an exception. */
PyObject *gs_py_step_result_new(PyTypeObject *type, gs_engine_t *e, const gs_step_result_t *r);

#endif
