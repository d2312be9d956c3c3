/* A shared-memory byte pipe between two processes on one host: one writer,
 * one reader, a ring of bytes in a shared-memory segment (a memfd). The host
 * backend (host_connect.c) puts one on each ring link whose two ends can both
 * map it, instead of the TCP stream; the TCP connection stays, for the
 * offer that sets the pipe up and for one-byte wake-ups when a side sleeps,
 * so poll(), abort and a peer's death behave as over TCP.
 *
 * The writer creates the segment with memfd_create, so it has no name in
 * any file system and lives only as long as a descriptor or a mapping of
 * it: an agent killed at any point (kill -9 between creating and sharing
 * the segment included) leaks nothing, by construction rather than by a
 * cleanup that might not run. The offer it sends over TCP is the path of
 * its descriptor, /proc/PID/fd/N, the identity of its /dev/shm and a random
 * cookie; the reader, if it sees the same /dev/shm (same machine, same
 * container), opens that path (a process may reopen the descriptors of
 * another of the same user) and checks size and cookie, so a path that
 * means something else on another host cannot match. Once the reader has
 * answered, the writer closes its descriptor: the two mappings are all
 * that is left, gone with the two processes. */
#ifndef GS_COMM_SHM_H
#define GS_COMM_SHM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GS_SHM_OFFER_LEN 64 /* bytes of an offer on the wire; all zero: "no pipe" */

typedef struct gs_shm_pipe gs_shm_pipe_t;

/* Writer: creates a pipe and fills `offer`. NULL when shared memory is not
 * available here (the caller stays on TCP). Close with gs__shm_close. */
gs_shm_pipe_t *gs__shm_create(uint8_t offer[GS_SHM_OFFER_LEN]);
/* Reader: maps the pipe an offer names; NULL if it cannot (another host or
 * container, a writer that has closed its offer, a cookie that does not
 * match). */
gs_shm_pipe_t *gs__shm_open(const uint8_t offer[GS_SHM_OFFER_LEN]);
/* Writer, once the reader has answered: closes the descriptor the offer
 * names, so nobody else can open the segment (the mappings stay until
 * both sides close). */
void gs__shm_close_offer(gs_shm_pipe_t *p);
/* Unmaps (and for the writer closes the offer, if not done yet); NULL is a
 * no-op. */
void gs__shm_close(gs_shm_pipe_t *p);

/* Copies up to len bytes in; returns how many (0: full). *wake is set when
 * the reader had gone to sleep and must be woken (over TCP). */
size_t gs__shm_write(gs_shm_pipe_t *p, const void *src, size_t len, bool *wake);
/* Copies up to len bytes out; returns how many (0: empty). *wake is set
 * when the writer had gone to sleep waiting for space. */
size_t gs__shm_read(gs_shm_pipe_t *p, void *dst, size_t len, bool *wake);

/* Before the reader (writer) sleeps: records that it does, then looks
 * again; false when data (space) came meanwhile and it must not sleep.
 * The other side's write (read) checks the record after publishing, so a
 * wake-up is never lost. */
bool gs__shm_reader_may_sleep(gs_shm_pipe_t *p);
bool gs__shm_writer_may_sleep(gs_shm_pipe_t *p);
/* After waking: clears the record. */
void gs__shm_reader_awake(gs_shm_pipe_t *p);
void gs__shm_writer_awake(gs_shm_pipe_t *p);

#endif
