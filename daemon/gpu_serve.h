/* SPDX-License-Identifier: MIT */
/*
 * gpu_serve.h - a GPU's worker process, what "devald --gpu-worker N" runs (gpu_serve.c).
 */
#pragma once

/* The worker process's main loop on sock, for GPU device. Return: its exit code. */
int gpu_serve_main(int sock, int device, int no_p2p);
