/* SPDX-License-Identifier: MIT */
/*
 * backend.h - the backend devald serves (backend.c).
 */
#pragma once

#include <stddef.h>

#include "daemon.h"

/* Set up arg_backend's backend: 0, or a negative errno with why. */
int backend_setup(Daemon *d, char *why, size_t whylen);
