/* SPDX-License-Identifier: MIT */
/*
 * fault.c - acting on $DEVAL_FAULT at a named fault point (see fault.h).
 */
#define _GNU_SOURCE
#include "fault.h"

#ifdef DEVAL_FAULT_POINTS
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/**
 * dv_fault() - act as $DEVAL_FAULT says if it names phase (and seq, when it names one).
 * An unparsable setting is reported on stderr once per point and ignored.
 */
void dv_fault(const char *phase, uint32_t seq) {
        const char *spec = getenv("DEVAL_FAULT");
        size_t n = strlen(phase);
        if (!spec || strncmp(spec, phase, n) != 0 || spec[n] != ':')
                return;
        char action[16] = "";
        unsigned long ms = 0, at = 0;
        const char *p = spec + n + 1;
        size_t alen = strcspn(p, ":@");
        if (alen == 0 || alen >= sizeof(action))
                goto bad;
        memcpy(action, p, alen);
        p += alen;
        if (*p == ':') {
                char *end;
                ms = strtoul(p + 1, &end, 10);
                p = end;
        }
        if (*p == '@') {
                char *end;
                at = strtoul(p + 1, &end, 10);
                p = end;
        }
        if (*p)
                goto bad;
        if (at && at != seq)
                return;
        if (strcmp(action, "exit") == 0)
                _exit(3); /* no atexit handlers, no goodbye */
        if (strcmp(action, "abort") == 0)
                abort();
        if (strcmp(action, "sigkill") == 0)
                raise(SIGKILL);
        if (strcmp(action, "sigstop") == 0) {
                raise(SIGSTOP);
                return;
        }
        if (strcmp(action, "sleep") == 0) {
                struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000};
                while (nanosleep(&ts, &ts) < 0) {
                }
                return;
        }
bad:
        fprintf(stderr, "deval: DEVAL_FAULT=%s is not PHASE:ACTION[:MS][@SEQ]; ignored\n", spec);
}
#endif
