/* SPDX-License-Identifier: MIT */
/*
 * config.h - devald's options (config.c).
 */
#pragma once

#include "daemon.h"

/* --backend: "auto", "host" or "cuda". */
extern char arg_backend[8];

#define CONFIG_DONE 1 /* --help or --version answered: exit 0 */

/* Read the configuration file and argv into d. Return: 0 when devald should run,
 * CONFIG_DONE, or a negative errno: -EINVAL for a bad option or line (said on stderr),
 * -ENOMEM. */
int config_parse(Daemon *d, int argc, char **argv);
/* SIGHUP: take what can change while running from the configuration and argv again. */
void config_reload(Daemon *d, int argc, char **argv);
