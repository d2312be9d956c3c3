/* Phase names (see phase.h). */
#include "phase.h"

#include "gradsync.pb.h"

static const char *const names[] = {
    [gradsync_Phase_PHASE_IDLE] = "idle",
    [gradsync_Phase_PHASE_DATA] = "data",
    [gradsync_Phase_PHASE_COMPUTE] = "compute",
    [gradsync_Phase_PHASE_ALLREDUCE] = "allreduce",
    [gradsync_Phase_PHASE_OPTIMIZER] = "optimizer",
    [gradsync_Phase_PHASE_CHECKPOINT] = "checkpoint",
    [gradsync_Phase_PHASE_SYNC] = "sync",
};

const char *gs_phase_name(uint32_t phase)
{
  return phase < sizeof(names) / sizeof(names[0]) ? names[phase] : "unknown";
}
