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

/*
 * The action $DEVAL_FAULT names for phase at seq, into action[16], and its MS; false when it
 * names another point or step. An unparsable setting is reported on stderr and ignored.
 */
static bool fault_action(const char *phase, uint32_t seq, char action[16], unsigned long *ret_ms) {
        const char *spec = secure_getenv("DEVAL_FAULT");
        size_t n = strlen(phase);
        if (!spec || strncmp(spec, phase, n) != 0 || spec[n] != ':')
                return false;
        unsigned long ms = 0, at = 0;
        const char *p = spec + n + 1;
        size_t alen = strcspn(p, ":@");
        if (alen == 0 || alen >= 16)
                goto bad;
        memcpy(action, p, alen);
        action[alen] = '\0';
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
                return false;
        *ret_ms = ms;
        return true;
bad:
        fprintf(stderr, "deval: DEVAL_FAULT=%s is not PHASE:ACTION[:MS][@SEQ]; ignored\n", spec);
        return false;
}

/* Does $DEVAL_FAULT ask point phase to do action, which the point carries out itself? */
bool dv_fault_says(const char *phase, uint32_t seq, const char *action) {
        char a[16] = "";
        unsigned long ms;
        return fault_action(phase, seq, a, &ms) && strcmp(a, action) == 0;
}

/** dv_fault() - act as $DEVAL_FAULT says if it names phase (and seq, when it names one). */
void dv_fault(const char *phase, uint32_t seq) {
        char action[16] = "";
        unsigned long ms;
        if (!fault_action(phase, seq, action, &ms))
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
        if (strcmp(action, "garbage") != 0) /* the point's own */
                fprintf(stderr, "deval: DEVAL_FAULT action '%s' is unknown; ignored\n", action);
}
#endif
