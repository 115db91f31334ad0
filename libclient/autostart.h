/* SPDX-License-Identifier: MIT */
/*
 * autostart.h - a private devald for this user, started when nothing answers.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

int dv_autostart(const char *sock, uint64_t idle_exit_s, char *err, size_t errlen);
