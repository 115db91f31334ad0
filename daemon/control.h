/* SPDX-License-Identifier: MIT */
/*
 * control.h - the control messages of a connection (control.c).
 */
#pragma once

#include <stdbool.h>

#include "daemon.h"

/* Read and act on one message from c. Return: false when the connection must be closed. */
bool control_handle(Daemon *d, Conn *c);
