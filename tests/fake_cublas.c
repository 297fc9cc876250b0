/* A stand-in for libcublas.so.13 with none of cuBLAS's entry points: put
 * first on LD_LIBRARY_PATH (test_batch_cuda_no_cublas), it is the library
 * the CUDA backend opens, finds lacking, and so runs the batched passes'
 * LM head as the GEMV, row by row, instead of the cuBLAS GEMM. */
int bn_test_not_cublas;
