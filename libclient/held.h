/* SPDX-License-Identifier: MIT */
#pragma once

#include "deval.h"

/*
 * held.h - the groups this process holds. A second deval_join() of one of them would wait
 * for a rank that never comes (the first membership is that rank), so it fails at once.
 */

void dv_held_add(deval_group *g);
void dv_held_remove(deval_group *g);
const deval_group *dv_held_find(const char *name, const char *socket_path);
