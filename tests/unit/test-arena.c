/* SPDX-License-Identifier: MIT */
/*
 * test-arena.c - devald's shared memory (daemon/arena.c) and the growth of a group's output
 * arena (daemon/output.c): an output arena is sealed so that nobody else can write it, an
 * input arena so that nobody can shrink it; the output grows by half again, with a new
 * generation that the done segment tells the ranks, charged to the group and its uid, and a
 * growth past the quota is refused, naming it, with nothing changed; the direct output the
 * ranks write is made on first use, writable by whoever holds it but never resized.
 */
#define _GNU_SOURCE
/* cmocka needs these first */
/* clang-format off */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
/* clang-format on */

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "deval.h"

#include "arena.h"
#include "output.h"
#include "usage.h"

static void test_seals(void **state) {
        (void)state;
        Arena out, in;
        assert_int_equal(arena_new("deval-test-out", 1 << 16, ARENA_OUTPUT, &out), 0);
        assert_int_equal(arena_new("deval-test-in", 1 << 16, ARENA_INPUT, &in), 0);
        struct stat st;
        assert_int_equal(fstat(out.fd, &st), 0);
        assert_int_equal(st.st_size, 1 << 16);
        int seals = fcntl(out.fd, F_GET_SEALS);
        assert_true(seals & F_SEAL_SHRINK && seals & F_SEAL_GROW && seals & F_SEAL_SEAL);
        assert_true(seals & F_SEAL_FUTURE_WRITE);
        out.map[0] = 1; /* devald's own mapping writes */
        /* a client's writable mapping of the output is refused */
        assert_true(mmap(NULL, 1 << 16, PROT_READ | PROT_WRITE, MAP_SHARED, out.fd, 0) ==
                    MAP_FAILED);
        void *ro = mmap(NULL, 1 << 16, PROT_READ, MAP_SHARED, out.fd, 0);
        assert_true(ro != MAP_FAILED);
        assert_int_equal(((uint8_t *)ro)[0], 1);
        munmap(ro, 1 << 16);
        seals = fcntl(in.fd, F_GET_SEALS);
        assert_true(seals & F_SEAL_SHRINK && seals & F_SEAL_GROW && !(seals & F_SEAL_WRITE));
        assert_int_equal(ftruncate(in.fd, 4096), -1); /* nobody shrinks it under devald */
        arena_deinit(&out);
        arena_deinit(&in);
        assert_int_equal(out.fd, -1);
        assert_null(out.map);
}

typedef struct {
        Daemon d;
        Usage u;
        Group g;
        DvDoneHeader done;
} Fixture;

static Fixture *fixture(uint64_t group_max, uint64_t user_max) {
        Fixture *f = calloc(1, sizeof(*f));
        f->d = (Daemon){.max_group_bytes = group_max, .max_user_bytes = user_max};
        f->u.uid = 1000;
        f->g.d = &f->d;
        f->g.usage = &f->u;
        f->g.uid = 1000;
        f->g.numa = -1;
        f->g.dhdr = &f->done;
        snprintf(f->g.name, sizeof(f->g.name), "grow");
        pthread_mutex_init(&f->g.lock, NULL);
        /* as a group starts: its first output arena, reserved and counted */
        assert_int_equal(arena_new("deval-test-out", 256 << 10, ARENA_OUTPUT, &f->g.locked.out), 0);
        assert_true(usage_reserve(&f->u, user_max, 256 << 10));
        f->g.locked.bytes_mapped = 256 << 10;
        return f;
}

static void test_output_growth(void **state) {
        (void)state;
        Fixture *f = fixture(64 << 20, 128 << 20);
        Group *g = &f->g;
        char msg[256];
        /* fits: nothing changes */
        assert_int_equal(output_ensure(g, 100 << 10, msg, sizeof(msg)), 0);
        assert_int_equal(g->locked.out_gen, 0);
        /* past it: half again, a new generation, told to the ranks, charged */
        memset(g->locked.out.map, 7, g->locked.out.size);
        assert_int_equal(output_ensure(g, 300 << 10, msg, sizeof(msg)), 0);
        assert_int_equal(g->locked.out.size, 384 << 10);
        assert_int_equal(g->locked.out_gen, 1);
        assert_int_equal(f->done.out_gen, 1);
        assert_int_equal(f->done.out_size, 384 << 10);
        assert_int_equal(g->locked.bytes_mapped, 384 << 10);
        assert_int_equal(atomic_load(&f->u.bytes), 384 << 10);
        assert_int_equal(g->locked.out.map[0], 0); /* a fresh arena */
        g->locked.out.map[g->locked.out.size - 1] = 1;
        /* a large one: what it needs, page-aligned */
        assert_int_equal(output_ensure(g, (40 << 20) + 1, msg, sizeof(msg)), 0);
        assert_int_equal(g->locked.out.size, (40 << 20) + 4096);
        assert_int_equal(g->locked.out_gen, 2);
        assert_int_equal(g->locked.bytes_mapped, (40 << 20) + 4096);
        /* past the group's quota: refused, named, nothing changed */
        assert_int_equal(output_ensure(g, 70 << 20, msg, sizeof(msg)), DEVAL_ENOMEM);
        assert_non_null(strstr(msg, "the result needs 73400320 bytes"));
        assert_non_null(strstr(msg, "--max-group-bytes"));
        assert_int_equal(g->locked.out.size, (40 << 20) + 4096);
        assert_int_equal(g->locked.out_gen, 2);
        assert_int_equal(atomic_load(&f->u.bytes), (40 << 20) + 4096);
        arena_deinit(&g->locked.out);
        free(f);
}

static void test_output_growth_user_quota(void **state) {
        (void)state;
        Fixture *f = fixture(64 << 20, 1 << 20); /* the uid may hold 1 MiB in all */
        char msg[256];
        assert_int_equal(output_ensure(&f->g, 2 << 20, msg, sizeof(msg)), DEVAL_ENOMEM);
        assert_non_null(strstr(msg, "--max-user-bytes"));
        assert_int_equal(atomic_load(&f->u.bytes), 256 << 10); /* nothing kept */
        assert_int_equal(f->g.locked.out_gen, 0);
        arena_deinit(&f->g.locked.out);
        free(f);
}

static void test_direct_output(void **state) {
        (void)state;
        Fixture *f = fixture(8 << 20, 128 << 20);
        Group *g = &f->g;
        g->loop.direct = ARENA_NULL;
        Arena a;
        uint64_t gen = 99;
        char msg[256];
        /* the current one, before any: made */
        assert_int_equal(output_direct(g, 0, &a, &gen, msg, sizeof(msg)), 0);
        assert_true(a.fd >= 0);
        assert_int_equal(gen, 1);
        int seals = fcntl(a.fd, F_GET_SEALS);
        assert_true(seals & F_SEAL_SHRINK && seals & F_SEAL_GROW && seals & F_SEAL_SEAL);
        assert_false(seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE));
        /* grown: a rank maps it writable, nobody resizes it; a new generation, charged */
        assert_int_equal(output_direct(g, 1 << 20, &a, &gen, msg, sizeof(msg)), 0);
        assert_int_equal(gen, 2);
        assert_true(a.size >= 1 << 20);
        assert_int_equal(g->locked.bytes_mapped, (256 << 10) + a.size);
        uint8_t *w = mmap(NULL, a.size, PROT_READ | PROT_WRITE, MAP_SHARED, a.fd, 0);
        assert_true(w != MAP_FAILED);
        w[a.size - 1] = 5;
        munmap(w, a.size);
        assert_int_equal(ftruncate(a.fd, 4096), -1);
        /* asked for less, or again: the same one */
        uint64_t size = a.size;
        assert_int_equal(output_direct(g, 4096, &a, &gen, msg, sizeof(msg)), 0);
        assert_int_equal(gen, 2);
        assert_int_equal(a.size, size);
        /* past the group's quota: refused, named, nothing changed */
        assert_int_equal(output_direct(g, 9 << 20, &a, &gen, msg, sizeof(msg)), DEVAL_ENOMEM);
        assert_non_null(strstr(msg, "--max-group-bytes"));
        assert_int_equal(g->loop.direct_gen, 2);
        assert_int_equal(g->loop.direct.size, size);
        arena_deinit(&g->loop.direct);
        arena_deinit(&g->locked.out);
        free(f);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_seals),
                cmocka_unit_test(test_output_growth),
                cmocka_unit_test(test_output_growth_user_quota),
                cmocka_unit_test(test_direct_output),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
