/*
 * dl_first.h - the first of several names of a shared library that dlopen
 * finds, for the libraries opened at run time (cuBLAS, NCCL).
 */
#ifndef BN_DL_FIRST_H
#define BN_DL_FIRST_H

#include <stddef.h>

/* dlopen(names[i], RTLD_NOW | RTLD_LOCAL) for i = 0, 1, ... until one
 * opens: its handle, and its name copied into chosen. NULL when none
 * does, with the loader's last message (or "<names[0]> not found") in why. */
void *bn_dl_first(const char *const *names, size_t n, char *chosen, size_t chosen_size,
                  char *why, size_t why_size);

#endif
