/* SPDX-License-Identifier: MIT */
/*
 * autostart.h - a private devald for this user, started when nothing answers.
 */
#pragma once

#include <stddef.h>

int dv_autostart(const char *sock, char *err, size_t errlen);
