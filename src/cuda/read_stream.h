/*
 * read_stream.h - a kernel that only reads (read_stream.cu): the floor for
 * any kernel that streams a buffer once, timed beside the W2A8 GEMV by
 * `bitnet bench kernels --device cuda`.
 */
#ifndef BN_READ_STREAM_H
#define BN_READ_STREAM_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Words of the sink the kernel folds its loads into. */
#define BN_READ_STREAM_SINK_WORDS 64

/* Reads bytes (a multiple of 16) from the 16-byte aligned device buffer
 * buf with `blocks` blocks of 512 threads, four 16-byte loads in flight per
 * thread (grid-stride, not kept in L1), and folds them into sink
 * (BN_READ_STREAM_SINK_WORDS words) so the loads cannot be dropped. With
 * pdl non-zero it is launched with programmatic stream serialization: its
 * loads start while the kernel before it finishes, and only its writes to
 * the sink wait (compute capability 9.0; bn_cuda_read_stream_pdl_compiled).
 * On an H200 one block per SM measured fastest of 12 launch shapes at
 * every size from 1.6 to 71 MB (docs/PERFORMANCE.md). */
cudaError_t bn_cuda_read_stream(const void *buf, size_t bytes, int blocks, int pdl,
                                uint32_t *sink, cudaStream_t stream);
/* Whether the kernel was compiled with the instructions pdl needs. */
int bn_cuda_read_stream_pdl_compiled(void);

#ifdef __cplusplus
}
#endif

#endif
