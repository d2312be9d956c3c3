/* The engine's membership of its job, owned by generation.c (the first
 * Join, and what follows from its answer) and elastic.c (a regroup's
 * Join): the request it joins with, the settings sent with it, the
 * coordinator's answer. Every other file of the engine reads who this
 * rank is through the functions below. */
#ifndef GS_ENGINE_MEMBERSHIP_H
#define GS_ENGINE_MEMBERSHIP_H

#include <stdbool.h>
#include <stdint.h>

#include "client.h"
#include "gradsync.pb.h"
#include "pb_array.h"

typedef struct engine_membership {
  gradsync_JoinRequest req; /* kept to re-register after a coordinator restart */
  gs_pb_array_t settings;   /* gradsync_Setting, sent with req (config.c) */
  gs_join_result_t join;    /* the answer to the latest Join */
  bool joined;
  bool grace_told; /* said once that --coordinator-grace is below the heartbeat timeout */
} engine_membership_t;

/* This rank, the world and the generation of the latest Join. */
static inline uint32_t gs__membership_rank(const engine_membership_t *m)
{
  return m->join.rank;
}

static inline uint32_t gs__membership_world(const engine_membership_t *m)
{
  return m->join.world_size;
}

static inline uint64_t gs__membership_generation(const engine_membership_t *m)
{
  return m->join.generation;
}

/* The whole answer, read only. */
static inline const gs_join_result_t *gs__membership_join(const engine_membership_t *m)
{
  return &m->join;
}

#endif
