/* SPDX-License-Identifier: MIT */
/*
 * arena.c - a rank's view of its group's shared memory: mapping the segments devald sends
 * (checked to be sealed memfds of the size it said), growing the input arena, following the
 * output arena when devald replaces it, the direct output the ranks write, and the same for a
 * device group's GPU memory.
 */
#define _GNU_SOURCE
#include "arena.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "gpu.h"
#include "handle.h"
#include "sock.h"
#include "util.h"

/*
 * Map a segment devald sent, after checking it is what devald makes: a memfd of exactly
 * size bytes sealed against shrinking and growing, so that no one holding it can make
 * this process fault on a page that went away (-EPROTO otherwise). The fd is closed.
 */
int dv_map_fd(int fd, uint64_t size, int prot, void **ret) {
        struct stat st;
        int seals = fcntl(fd, F_GET_SEALS);
        if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size != size ||
            seals < 0 || (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW)) {
                close(fd);
                return -EPROTO;
        }
        void *p = mmap(NULL, size ? size : 1, prot, MAP_SHARED, fd, 0);
        close(fd);
        if (p == MAP_FAILED)
                return -errno;
        *ret = p;
        return 0;
}

/*
 * A control message answered with one arena: its descriptor (ours to close) in *ret_fd and
 * the reply in *rep, after checking it is at least min_size bytes.
 */
static int request_arena(deval_group *g, const void *req, size_t len, uint64_t min_size,
                         DvReply *rep, int *ret_fd) {
        int fds[DV_MAX_FDS], nfds, r;

        if ((r = dv_request(g, req, len, rep, fds, &nfds)) < 0)
                return r;
        if (rep->status < 0)
                return dv_set_err(g, rep->status, "%s", rep->msg);
        if (nfds != 1 || rep->size[0] < min_size) {
                for (int i = 0; i < nfds; i++)
                        close(fds[i]);
                return dv_set_err(g, DEVAL_EPROTO, "devald sent a malformed arena");
        }
        *ret_fd = fds[0];
        return 0;
}

/* Map the arena devald answered with (fd, size bytes) with prot, naming what on a failure. */
static int map_reply(deval_group *g, int fd, uint64_t size, int prot, const char *what,
                     void **ret) {
        int r = dv_map_fd(fd, size, prot, ret);
        if (r < 0)
                return dv_set_err(g, r == -EPROTO ? DEVAL_EPROTO : DEVAL_ENOMEM,
                                  "cannot map %llu bytes of %s: %s", (unsigned long long)size, what,
                                  strerror(-r));
        return 0;
}

/**
 * dv_reserve_input() - make sure the input arena holds size bytes, asking devald to grow it.
 * Return: 0, DEVAL_ENOMEM past the group's quota, or a connection failure.
 */
int dv_reserve_input(deval_group *g, uint64_t size) {
        DvGrowReq req = {.hdr = {DV_PROTO_VERSION, DV_MSG_GROW}, .size = size};
        DvReply rep;
        int fd, r;
        void *p = NULL;

        if (size <= g->in_size)
                return 0;
        if ((r = request_arena(g, &req, sizeof(req), size, &rep, &fd)) < 0)
                return r;
        if ((r = map_reply(g, fd, rep.size[0], PROT_READ | PROT_WRITE, "input", &p)) < 0)
                return r;
        /* what deval_input_buffer() handed out moves along with the arena */
        if (g->in_keep)
                memcpy(p, g->in, DV_MIN(g->in_keep, g->in_size));
        munmap(g->in, g->in_size ? g->in_size : 1);
        g->in = p;
        g->in_size = rep.size[0];
        return 0;
}

/**
 * dv_refresh_output() - map the current output arena if devald replaced it.
 * Return: 0, or a connection failure.
 */
int dv_refresh_output(deval_group *g) {
        DvMsgHdr req = {DV_PROTO_VERSION, DV_MSG_OUTPUT};
        DvReply rep;
        int fd, r;
        void *p = NULL;

        if (g->done->out_gen == g->out_gen)
                return 0;
        if ((r = request_arena(g, &req, sizeof(req), 0, &rep, &fd)) < 0)
                return r;
        if ((r = map_reply(g, fd, rep.size[0], PROT_READ, "output", &p)) < 0)
                return r;
        munmap((void *)g->out, g->out_size ? g->out_size : 1);
        g->out = p;
        g->out_size = rep.size[0];
        g->out_gen = rep.gen;
        return 0;
}

/**
 * dv_direct_output() - map the group's direct output (wire.h, DV_REQ_DIRECT), which every rank
 * writes, after asking devald to make it hold size bytes; size 0 takes the current one, which
 * another rank had grown.
 * Return: 0, DEVAL_ENOMEM past the group's quota, or a connection failure.
 */
int dv_direct_output(deval_group *g, uint64_t size) {
        DvGrowReq req = {.hdr = {DV_PROTO_VERSION, DV_MSG_DIRECT}, .size = size};
        DvReply rep;
        int fd, r;
        void *p = NULL;

        if ((r = request_arena(g, &req, sizeof(req), size, &rep, &fd)) < 0)
                return r;
        if (rep.gen == g->direct.gen && g->direct.out && rep.size[0] == g->direct.size) {
                close(fd);
                return 0;
        }
        if ((r = map_reply(g, fd, rep.size[0], PROT_READ | PROT_WRITE, "direct output", &p)) < 0)
                return r;
        if (g->direct.out)
                munmap(g->direct.out, g->direct.size ? g->direct.size : 1);
        g->direct.out = p;
        g->direct.size = rep.size[0];
        g->direct.gen = rep.gen;
        return 0;
}

/* Map a device arena descriptor from devald on this rank's GPU; the fd is closed. */
int dv_import_dev(deval_group *g, int fd, uint64_t size, uint64_t *ret) {
        int r = dv_gpu()->import_fd(g->device, fd, size, ret);
        close(fd);
        return r < 0 ? dv_set_err(g, r, "cannot map devald's device arena: %s", dv_gpu_error()) : 0;
}

/**
 * dv_reserve_dev_input() - dv_reserve_input() for the device input arena of a device group.
 */
int dv_reserve_dev_input(deval_group *g, uint64_t size) {
        DvGrowReq req = {.hdr = {DV_PROTO_VERSION, DV_MSG_GROW}, .size = size, .device = 1};
        DvReply rep;
        int fd, r;
        uint64_t p;

        if (size <= g->din_size)
                return 0;
        if ((r = request_arena(g, &req, sizeof(req), size, &rep, &fd)) < 0 ||
            (r = dv_import_dev(g, fd, rep.size[0], &p)) < 0)
                return r;
        dv_gpu()->unmap(g->device, g->din, g->din_size);
        g->din = p;
        g->din_size = rep.size[0];
        return 0;
}

/**
 * dv_refresh_dev_output() - map this rank's device output arena if devald replaced it.
 */
int dv_refresh_dev_output(deval_group *g) {
        DvMsgHdr req = {DV_PROTO_VERSION, DV_MSG_DEV_OUTPUT};
        DvReply rep;
        int fd, r;
        uint64_t p;

        if (g->done->dev_out_gen == g->dout_gen)
                return 0;
        if ((r = request_arena(g, &req, sizeof(req), 0, &rep, &fd)) < 0 ||
            (r = dv_import_dev(g, fd, rep.size[0], &p)) < 0)
                return r;
        dv_gpu()->unmap(g->device, g->dout, g->dout_size);
        g->dout = p;
        g->dout_size = rep.size[0];
        g->dout_gen = rep.dev_gen;
        return 0;
}
