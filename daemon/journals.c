/* SPDX-License-Identifier: MIT */
/*
 * journals.c - the journals devald keeps for passes that may resume (journals.h).
 *
 * A rank asks for its journal of a pass by the job's resume key, the group, the pass's
 * ordinal and its rank; devald makes it (a memfd, or a file when the rank asks for
 * write-through) or hands back the one it kept, and grows it when asked, within the uid's
 * --max-user-bytes. What a journal holds is the rank's to write and read (libclient/
 * resume.c); devald reads only its header's counts, for deval-ctl, and never trusts them.
 *
 * A file lives in --state-dir when given (it survives a reboot: devald asks the ranks to
 * sync each batch), else in the directory of devald's socket (the user's runtime directory:
 * it survives devald's restart). Its name is a hash of what it keeps, never the client's
 * words. journals_load() learns an earlier devald's files when devald starts.
 */
#define _GNU_SOURCE
#include "journals.h"

#include <dirent.h>
#include <fcntl.h>
#include <inttypes.h>
#include <libgen.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include "journal.h"
#include "log.h"
#include "reply.h"
#include "sock.h"
#include "usage.h"
#include "util.h"

#define JOURNAL_FIRST (64u << 10) /* a new journal's bytes */
#define JOURNAL_STEP  (64u << 10) /* sizes are multiples of it */

struct Journal {
        struct Journal *next;
        uid_t uid;
        Usage *usage;
        char key[DV_RESUME_KEY_MAX];
        char group[DV_GROUP_NAME_MAX];
        uint32_t ordinal;
        int32_t rank, world;
        int fd;
        uint64_t size;
        bool file;
        char path[512];    /* a file's */
        uint64_t used_ns;  /* when a rank last opened or grew it, or its batches last moved */
        uint64_t seen_end; /* its header's end at the last look */
};

/* The directory files go to: --state-dir's journal/, else the socket's directory's. */
static int journal_dir(const Daemon *d, char *dir, size_t len, bool make) {
        if (d->state_dir[0]) {
                snprintf(dir, len, "%s/journal", d->state_dir);
        } else {
                char sock[sizeof(d->socket_path)];
                snprintf(sock, sizeof(sock), "%s", d->socket_path);
                snprintf(dir, len, "%s/journal", dirname(sock));
        }
        if (make && mkdir(dir, 0700) < 0 && errno != EEXIST)
                return -errno;
        return 0;
}

static uint64_t name_hash(const DvJournalReq *r) {
        uint64_t h = DV_JOURNAL_HASH0;
        h = dv_journal_hash(h, r->key, strnlen(r->key, sizeof(r->key)));
        h = dv_journal_hash(h, "\0", 1);
        h = dv_journal_hash(h, r->group, strnlen(r->group, sizeof(r->group)));
        uint32_t n[2] = {r->ordinal, (uint32_t)r->rank};
        return dv_journal_hash(h, n, sizeof(n));
}

static Journal *find(Daemon *d, uid_t uid, const DvJournalReq *r) {
        for (Journal *j = d->journals; j; j = j->next)
                if (j->uid == uid && j->ordinal == r->ordinal && j->rank == r->rank &&
                    strcmp(j->key, r->key) == 0 && strcmp(j->group, r->group) == 0)
                        return j;
        return NULL;
}

static void journal_free(Daemon *d, Journal *j, bool unlink_file) {
        for (Journal **p = &d->journals; *p; p = &(*p)->next)
                if (*p == j) {
                        *p = j->next;
                        break;
                }
        if (j->file && unlink_file)
                unlink(j->path);
        close(j->fd);
        atomic_fetch_sub(&j->usage->bytes, j->size);
        j->usage->fds--;
        usage_put(d, j->usage);
        d->njournals--;
        d->journals_mem -= !j->file;
        free(j);
}

/* Grow j to hold want bytes at least, within its uid's quota. Return: 0 or DEVAL_E*. */
static int grow(Daemon *d, Journal *j, uint64_t want, char *why, size_t len) {
        if (want <= j->size)
                return 0;
        uint64_t size = DV_ALIGN(DV_MAX(want, j->size + j->size / 2), JOURNAL_STEP);
        if (size < want || !usage_reserve(j->usage, d->max_user_bytes, size - j->size)) {
                snprintf(why, len,
                         "a resume journal of %" PRIu64 " bytes would take uid %u past its "
                         "%" PRIu64 " bytes (--max-user-bytes)",
                         size, (unsigned)j->uid, d->max_user_bytes);
                return DEVAL_ENOMEM;
        }
        if (ftruncate(j->fd, (off_t)size) < 0) {
                int e = errno;
                atomic_fetch_sub(&j->usage->bytes, size - j->size);
                snprintf(why, len, "could not grow a resume journal to %" PRIu64 " bytes: %s", size,
                         strerror(e));
                return e == ENOSPC ? DEVAL_ENOMEM : DEVAL_ESYS;
        }
        j->size = size;
        return 0;
}

/* A new journal for r, empty, its header's flags set. Return: 0 with *ret, or DEVAL_E*. */
static int make(Daemon *d, Conn *c, const DvJournalReq *r, Journal **ret, char *why, size_t len) {
        if (c->usage->fds + 1 > d->max_user_fds) {
                snprintf(why, len,
                         "a resume journal would take uid %u past its %d descriptors "
                         "(--max-user-fds)",
                         (unsigned)c->uid, d->max_user_fds);
                return DEVAL_ENOMEM;
        }
        Journal *j = calloc(1, sizeof(*j));
        if (!j)
                return DEVAL_ENOMEM;
        j->uid = c->uid;
        j->usage = c->usage;
        memcpy(j->key, r->key, sizeof(j->key));
        memcpy(j->group, r->group, sizeof(j->group));
        j->ordinal = r->ordinal;
        j->rank = r->rank;
        j->world = r->world;
        j->file = r->flags & DV_JOURNAL_REQ_FILE;
        j->fd = -1;
        char dir[400] = "";
        if (j->file) {
                int e = journal_dir(d, dir, sizeof(dir), true);
                if (e == 0) {
                        snprintf(j->path, sizeof(j->path), "%s/%u-%016" PRIx64 ".dvj", dir,
                                 (unsigned)c->uid, name_hash(r));
                        j->fd = open(j->path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW,
                                     0600);
                        e = j->fd < 0 ? -errno : 0;
                }
                if (e == 0 && geteuid() == 0 && fchown(j->fd, c->uid, (gid_t)-1) < 0)
                        e = -errno;
                if (e < 0) {
                        snprintf(why, len, "could not make a resume journal in %s: %s", dir,
                                 strerror(-e));
                        if (j->fd >= 0)
                                close(j->fd);
                        free(j);
                        return DEVAL_ESYS;
                }
        } else if ((j->fd = memfd_create("deval-journal", MFD_CLOEXEC | MFD_ALLOW_SEALING)) < 0 ||
                   fcntl(j->fd, F_ADD_SEALS, F_SEAL_SHRINK) < 0) { /* no rank may fault */
                snprintf(why, len, "could not make a resume journal: %s", strerror(errno));
                if (j->fd >= 0)
                        close(j->fd);
                free(j);
                return DEVAL_ESYS;
        }
        c->usage->fds++;
        j->next = d->journals;
        d->journals = j;
        d->njournals++;
        d->journals_mem += !j->file;
        int s = grow(d, j, JOURNAL_FIRST, why, len);
        DvJournalHdr h = {.flags = j->file && d->state_dir[0] ? DV_JOURNAL_SYNC : 0};
        if (s == 0 && pwrite(j->fd, &h, sizeof(h), 0) != (ssize_t)sizeof(h)) {
                snprintf(why, len, "could not write a resume journal: %s", strerror(errno));
                s = DEVAL_ESYS;
        }
        if (s < 0) {
                journal_free(d, j, true);
                return s;
        }
        *ret = j;
        return 0;
}

static bool req_ok(const Daemon *d, const DvJournalReq *r) {
        if (!memchr(r->key, 0, sizeof(r->key)) || !memchr(r->group, 0, sizeof(r->group)))
                return false;
        if (r->action == DV_JOURNAL_DROP_KEY)
                return true;
        return r->key[0] && r->ordinal > 0 && r->world > 0 && r->world <= d->max_world &&
               r->rank >= 0 && r->rank < r->world;
}

static void list(Daemon *d, Conn *c) {
        size_t cap = sizeof(DvJournalList) + DV_JOURNALS_MAX * sizeof(DvJournalInfo);
        _cleanup_(freep) DvJournalList *l = calloc(1, cap);
        if (!l) {
                conn_reply(c, DEVAL_ENOMEM, "devald is out of memory");
                return;
        }
        l->hdr = (DvMsgHdr){DV_PROTO_VERSION, DV_MSG_JOURNALS};
        l->keep_s = (uint32_t)d->resume_keep_s;
        uint64_t now = dv_now_ns();
        for (Journal *j = d->journals; j; j = j->next) {
                if (j->uid != c->uid && c->uid != 0)
                        continue;
                l->total++;
                if (l->n == DV_JOURNALS_MAX)
                        continue;
                DvJournalInfo *i = &l->j[l->n++];
                DvJournalHdr h = {0};
                if (pread(j->fd, &h, offsetof(DvJournalHdr, made_s), 0) < 0)
                        h.batches = 0;
                memcpy(i->key, j->key, sizeof(i->key));
                memcpy(i->group, j->group, sizeof(i->group));
                i->ordinal = j->ordinal;
                i->rank = j->rank;
                i->world = j->world;
                i->file = j->file;
                i->bytes = j->size;
                i->batches = h.magic == DV_JOURNAL_MAGIC ? atomic_load(&h.batches) : 0;
                i->used = h.magic == DV_JOURNAL_MAGIC ? DV_MIN(atomic_load(&h.end), j->size) : 0;
                i->idle_s = (now - j->used_ns) / 1000000000ull;
        }
        size_t len = sizeof(*l) + l->n * sizeof(DvJournalInfo);
        ssize_t k = dv_send_msg(c->fd, l, len, NULL, 0, MSG_DONTWAIT);
        if (k < 0)
                log_warn("could not send the journals to pid %d: %s", (int)c->pid,
                         strerror((int)-k));
}

void journals_request(Daemon *d, Conn *c, const DvJournalReq *r) {
        char why[DV_MSG_MAX] = "";
        Journal *j;
        int s = 0;

        if (r->hdr.type == DV_MSG_JOURNALS) {
                list(d, c);
                return;
        }
        if (!req_ok(d, r)) {
                conn_reply(c, DEVAL_EPROTO, "a malformed resume journal request");
                return;
        }
        switch (r->action) {
        case DV_JOURNAL_OPEN:
        case DV_JOURNAL_GROW:
                j = find(d, c->uid, r);
                if (j && j->world != r->world) { /* another job's shape: not this pass's */
                        journal_free(d, j, true);
                        j = NULL;
                }
                if (!j && r->action == DV_JOURNAL_GROW) {
                        conn_reply(c, DEVAL_EINVAL, "no such resume journal (dropped?)");
                        return;
                }
                if (!j)
                        s = make(d, c, r, &j, why, sizeof(why));
                if (s == 0 && r->action == DV_JOURNAL_GROW)
                        s = grow(d, j, r->size, why, sizeof(why));
                if (s < 0) {
                        conn_reply(c, s, why[0] ? why : "devald is out of memory");
                        return;
                }
                j->used_ns = dv_now_ns();
                conn_reply_segments(c, &(ConnSegments){.fds = &j->fd, .sizes = &j->size, .n = 1});
                return;
        case DV_JOURNAL_DROP:
                if ((j = find(d, c->uid, r)))
                        journal_free(d, j, true);
                conn_reply(c, 0, "");
                return;
        case DV_JOURNAL_DROP_STALE:
                for (Journal *k = d->journals, *next; k; k = next) {
                        DvJournalHdr h;
                        next = k->next;
                        if (k->uid != c->uid || k->rank != r->rank || k->ordinal == r->ordinal ||
                            strcmp(k->key, r->key) != 0 || strcmp(k->group, r->group) != 0)
                                continue;
                        if (pread(k->fd, &h, sizeof(h), 0) == (ssize_t)sizeof(h) &&
                            h.magic == DV_JOURNAL_MAGIC && h.loader == r->size)
                                journal_free(d, k, true);
                }
                conn_reply(c, 0, "");
                return;
        case DV_JOURNAL_DROP_KEY: {
                int n = 0;
                for (Journal *k = d->journals, *next; k; k = next) {
                        next = k->next;
                        if ((k->uid == c->uid || c->uid == 0) &&
                            (!r->key[0] || strcmp(k->key, r->key) == 0)) {
                                journal_free(d, k, true);
                                n++;
                        }
                }
                snprintf(why, sizeof(why), "dropped %d resume journal%s", n, n == 1 ? "" : "s");
                conn_reply(c, 0, why);
                return;
        }
        }
        conn_reply(c, DEVAL_EPROTO, "a malformed resume journal request");
}

/* Learn the file at path, an earlier devald's: its header says what it keeps. */
static void load_one(Daemon *d, const char *path) {
        int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
        struct stat st;
        DvJournalHdr h;
        if (fd < 0)
                return;
        if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size < (off_t)sizeof(h) ||
            pread(fd, &h, sizeof(h), 0) != (ssize_t)sizeof(h) || h.magic != DV_JOURNAL_MAGIC ||
            !memchr(h.key, 0, sizeof(h.key)) || !memchr(h.group, 0, sizeof(h.group)) ||
            h.world <= 0 || h.rank < 0 || h.rank >= h.world || !h.key[0]) {
                close(fd);
                log_warn("%s is not a resume journal; left alone", path);
                return;
        }
        Usage *u = usage_get(d, st.st_uid);
        Journal *j = calloc(1, sizeof(*j));
        if (!u || !j || !usage_reserve(u, UINT64_MAX, (uint64_t)st.st_size)) {
                free(j);
                usage_put(d, u);
                close(fd);
                return;
        }
        *j = (Journal){.uid = st.st_uid,
                       .usage = u,
                       .ordinal = h.ordinal,
                       .rank = h.rank,
                       .world = h.world,
                       .fd = fd,
                       .size = (uint64_t)st.st_size,
                       .file = true,
                       .used_ns = dv_now_ns()};
        memcpy(j->key, h.key, sizeof(j->key));
        memcpy(j->group, h.group, sizeof(j->group));
        snprintf(j->path, sizeof(j->path), "%s", path);
        u->fds++;
        j->next = d->journals;
        d->journals = j;
        d->njournals++;
}

void journals_load(Daemon *d) {
        char dir[400];
        journal_dir(d, dir, sizeof(dir), false);
        DIR *dp = opendir(dir);
        if (!dp)
                return;
        struct dirent *e;
        int n = 0;
        while ((e = readdir(dp))) {
                size_t len = strlen(e->d_name);
                if (len < 5 || strcmp(e->d_name + len - 4, ".dvj") != 0)
                        continue;
                char path[sizeof(((Journal *)0)->path)];
                snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
                int before = d->njournals;
                load_one(d, path);
                n += d->njournals > before;
        }
        closedir(dp);
        if (n)
                log_info("kept %d resume journal%s from %s", n, n == 1 ? "" : "s", dir);
}

void journals_expire(Daemon *d, uint64_t now, int64_t *next_ns) {
        if (!d->journals || d->resume_keep_s <= 0)
                return;
        uint64_t keep = (uint64_t)d->resume_keep_s * 1000000000ull;
        for (Journal *j = d->journals, *next; j; j = next) {
                next = j->next;
                uint64_t end = 0;
                if (pread(j->fd, &end, sizeof(end), offsetof(DvJournalHdr, end)) == 8 &&
                    end != j->seen_end) { /* a rank is writing it */
                        j->seen_end = end;
                        j->used_ns = now;
                }
                if (now - j->used_ns >= keep) {
                        log_info("dropping the resume journal of group '%s' rank %d, idle "
                                 "for %d s (--resume-keep)",
                                 j->group, j->rank, d->resume_keep_s);
                        journal_free(d, j, true);
                        continue;
                }
                /* looked at again within a minute, so that a writer's progress is seen */
                int64_t left = (int64_t)DV_MIN(j->used_ns + keep - now, 60000000000ull);
                if (*next_ns < 0 || left < *next_ns)
                        *next_ns = left;
        }
}

bool journals_in_memory(const Daemon *d) {
        return d->journals_mem > 0;
}

void journals_close(Daemon *d) {
        while (d->journals)
                journal_free(d, d->journals, false);
}
