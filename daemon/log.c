/* SPDX-License-Identifier: MIT */
/*
 * log.c - devald's stderr logger. Lines are written with one write(2) so that lines from
 * worker threads never interleave.
 */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int log_max = LOG_LEVEL_INFO;
static int log_journal;

void log_setup(int max_level) {
        log_max = max_level;
        log_journal = getenv("JOURNAL_STREAM") != NULL;
}

int log_parse_level(const char *s) {
        static const struct {
                const char *name;
                int level;
        } names[] = {{"err", LOG_LEVEL_ERR},   {"error", LOG_LEVEL_ERR},
                     {"warn", LOG_LEVEL_WARN}, {"warning", LOG_LEVEL_WARN},
                     {"info", LOG_LEVEL_INFO}, {"debug", LOG_LEVEL_DEBUG}};
        for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
                if (strcmp(s, names[i].name) == 0)
                        return names[i].level;
        return -1;
}

void log_printf(int level, const char *fmt, ...) {
        char line[1024];
        int n = 0;
        va_list ap;

        if (level > log_max)
                return;
        if (log_journal)
                n = snprintf(line, sizeof(line), "<%d>", level);
        else
                n = snprintf(line, sizeof(line), "devald: ");
        va_start(ap, fmt);
        n += vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
        va_end(ap);
        if (n > (int)sizeof(line) - 2)
                n = (int)sizeof(line) - 2;
        line[n++] = '\n';
        if (write(STDERR_FILENO, line, (size_t)n) < 0) {
                /* nowhere left to report it */
        }
}
