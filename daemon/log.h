/* SPDX-License-Identifier: MIT */
/*
 * log.h - devald's log: one line per event on stderr, with a syslog "<N>" level prefix when
 * stderr is the journal ($JOURNAL_STREAM), so journald keeps the levels.
 */
#pragma once

enum {
        LOG_LEVEL_ERR = 3,
        LOG_LEVEL_WARN = 4,
        LOG_LEVEL_INFO = 6,
        LOG_LEVEL_DEBUG = 7
};

void log_setup(int max_level);
int log_parse_level(const char *s);
void log_printf(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define log_err(...)   log_printf(LOG_LEVEL_ERR, __VA_ARGS__)
#define log_warn(...)  log_printf(LOG_LEVEL_WARN, __VA_ARGS__)
#define log_info(...)  log_printf(LOG_LEVEL_INFO, __VA_ARGS__)
#define log_debug(...) log_printf(LOG_LEVEL_DEBUG, __VA_ARGS__)
