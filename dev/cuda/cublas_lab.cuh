/* cublas_check.cuh - for the labs that link cuBLAS: CUBLAS_CHECK exits with
 * the call and its status when a cuBLAS call fails. */
#ifndef LAB_CUBLAS_CHECK_CUH
#define LAB_CUBLAS_CHECK_CUH

#include <cublas_v2.h>
#include <stdio.h>
#include <stdlib.h>

#define CUBLAS_CHECK(call)                                                                         \
    do {                                                                                           \
        const cublasStatus_t s_ = (call);                                                          \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                         \
            fprintf(stderr, "%s:%d: %s: cuBLAS status %d\n", __FILE__, __LINE__, #call, (int)s_);  \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

#endif
