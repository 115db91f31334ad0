/* SPDX-License-Identifier: MIT */
/*
 * backend.h - the backend devald serves (backend.c).
 */
#pragma once

#include "daemon.h"

/* Set up arg_backend's backend: 0, or -1 after saying why. */
int backend_setup(Daemon *d);
