/* SPDX-License-Identifier: MIT */
/*
 * config.h - devald's options (config.c).
 */
#pragma once

#include "daemon.h"

/* --backend: "auto", "host" or "cuda". */
extern char arg_backend[8];

/* Read the configuration file and argv into d. Return: -1 when devald should run, else the
 * exit status (0 after --help or --version, 2 on an error, said on stderr). */
int config_parse(Daemon *d, int argc, char **argv);
/* SIGHUP: take what can change while running from the configuration and argv again. */
void config_reload(Daemon *d, int argc, char **argv);
