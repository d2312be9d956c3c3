/* Heartbeats: progress reports from running ranks, the directives they
 * get back, and the liveness sweep that loses a silent rank. */
#ifndef GS_HEARTBEAT_H
#define GS_HEARTBEAT_H

#include "job.h"

/* A heartbeat for `job` (a Heartbeat's, or a beat of a NodeHeartbeat:
 * call->news_only). O(1) and allocation-free for a running rank. The
 * rank's first heartbeat makes its connection the one whose loss loses the
 * rank (the agent heartbeats on a connection of its own, not the one it
 * joined on); heartbeats for it from any other connection are then refused
 * (FAILED_PRECONDITION). */
void gs__heartbeat(gs_job_t *job, const gs_call_t *call, const gs_beat_t *b);
/* Around the beats of one NodeHeartbeat (start true, then false): the
 * reply to a heartbeat is built or checked once for all of them, as
 * nothing a heartbeat does changes a directive or the verdict. */
void gs__heartbeat_node_beats(gs_job_t *job, bool start);
/* Answers every heartbeat of `job` that waits for news (wait_ms), once
 * job->news grew: a generation's end or a directive reaches every rank
 * at once, not at its next heartbeat. O(waiting) per change. */
void gs__heartbeat_tell_news(gs_job_t *job);
/* Answers m's waiting heartbeat, if any (it left: its agent stops the
 * heartbeat next, which need not wait for the reply). */
void gs__heartbeat_release(gs_member_t *m);
/* Loses the rank silent for longer than the heartbeat timeout, if any:
 * only the head of the heartbeat list is read. */
void gs__heartbeat_sweep(gs_job_t *job, uint64_t now);

#endif
