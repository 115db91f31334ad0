/* SPDX-License-Identifier: MIT */
/*
 * span-engine.c - an engine between the leaders of a spanning group, made of shared memory:
 * each leader writes its round's bytes into its node's slot and waits until every leader has
 * posted that round. It can fail on one node (an error, silence, garbled bytes) from a given
 * round, so that tests see what every rank reports then.
 */
#define _GNU_SOURCE
#include "span-engine.h"

#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

typedef struct {
        SpanShm *shm;
        int node, nodes;
        uint64_t round;
} Engine;

SpanShm *span_shm;

int span_engine_setup(void) {
        span_shm = mmap(NULL, sizeof(SpanShm), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                        -1, 0);
        return span_shm == MAP_FAILED ? -1 : 0;
}

void span_engine_reset(void) {
        memset(span_shm, 0, offsetof(SpanShm, slots));
}

static double now_ms(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* A leader writes its round's bytes in its slot (by parity: it writes round r + 2 only after
 * every leader posted r + 1, so after every leader read round r), then waits for the others. */
int span_engine_allgather(void *ctx, const void *send, void *recv, size_t len, int timeout_ms,
                          char *why, size_t why_len) {
        Engine *e = ctx;
        SpanShm *s = e->shm;
        uint64_t r = ++e->round;
        int p = (int)(r % 2);

        if (len > SPAN_SLOT) {
                snprintf(why, why_len, "the test engine carries %u bytes at most", SPAN_SLOT);
                return DEVAL_ENOTSUP;
        }
        if (e->node == s->node && (int)r >= s->round) {
                if (s->mode == FAIL_ERROR) {
                        snprintf(why, why_len, "node %d: the cable is cut", e->node);
                        return DEVAL_EPEER;
                }
                if (s->mode == FAIL_SILENT) { /* answers long after the deadline */
                        sleep((unsigned)(timeout_ms / 1000 * 3 + 1));
                        snprintf(why, why_len, "node %d woke past the deadline", e->node);
                        return DEVAL_ETIMEDOUT;
                }
        }
        memcpy(s->slots[p][e->node], send, len);
        atomic_store_explicit(&s->posted[e->node], r, memory_order_release);
        double end = timeout_ms < 0 ? 1e300 : now_ms() + timeout_ms;
        for (int n = 0; n < e->nodes; n++) {
                while (atomic_load_explicit(&s->posted[n], memory_order_acquire) < r) {
                        if (now_ms() > end) {
                                snprintf(why, why_len, "node %d did not answer within %d ms", n,
                                         timeout_ms);
                                return DEVAL_ETIMEDOUT;
                        }
                        usleep(20);
                }
        }
        for (int n = 0; n < e->nodes; n++) {
                uint8_t *dst = (uint8_t *)recv + (size_t)n * len;
                if (dst != s->slots[p][n])
                        memmove(dst, s->slots[p][n], len);
                if (s->mode == FAIL_GARBLE && n != e->node && (int)r >= s->round)
                        for (int k = 0; k < 4; k++) /* the same bytes on every leader */
                                dst[(r * 7919u + (unsigned)k * 104729u) % len] ^= (uint8_t)(k + 1);
        }
        return 0;
}

int span_join_named(const Harness *h, const char *name, int node, int nodes, int rank, int world,
                    int local_rank, int local_world, int timeout_ms, deval_group **g) {
        static Engine e; /* one per process: a rank joins one spanning group at a time */
        e = (Engine){.shm = span_shm, .node = node, .nodes = nodes};
        deval_engine eng = {DEVAL_ENGINE_INIT, .nodes = nodes, .node = node, .ctx = &e,
                            .allgather = span_engine_allgather};
        deval_join_opts o = {DEVAL_JOIN_OPTS_INIT, .timeout_ms = timeout_ms,
                             .socket_path = h->socket};
        return deval_join_spanning(name, rank, world, local_rank, local_world, &o, &eng, g);
}

int span_join(const Harness *h, const Span *sp, int rank, int world, deval_group **g) {
        int node = sp->layout[rank], nodes = 0, lrank = 0, lworld = 0;
        for (int k = 0; k < world; k++) {
                nodes = sp->layout[k] + 1 > nodes ? sp->layout[k] + 1 : nodes;
                if (sp->layout[k] == node) {
                        lrank += k < rank;
                        lworld++;
                }
        }
        char name[64];
        snprintf(name, sizeof(name), "%s-%d", sp->name, (int)getppid());
        return span_join_named(h, name, node, nodes, rank, world, lrank, lworld, sp->timeout_ms, g);
}
