/*
 * bitnet.h - public C API of libbitnet, a runtime for 1.58-bit (ternary)
 * language models on NVIDIA GPUs with CPU kernels as the fallback.
 *
 * Conventions: every fallible function returns a bn_status and, when the
 * caller passes a bn_error, fills it with a message and a hint saying what to
 * do about it. The library never exits, aborts or prints except through its
 * logger (BITNET_LOG).
 *
 * Arguments are validated: given a NULL pointer (other than an optional
 * bn_error) or a value out of range, a function returning bn_status returns
 * BN_ERR_INVALID_ARGUMENT with a message, a void function does nothing, and
 * the other functions return what their comment says. None of them crashes
 * or reads out of bounds on such arguments.
 */
#ifndef BITNET_H
#define BITNET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "bitnet_version.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Status and errors                                                         */
/* ------------------------------------------------------------------------ */

typedef enum bn_status {
    BN_OK = 0,
    BN_ERR_INVALID_ARGUMENT,  /* a caller passed a bad value               */
    BN_ERR_INVALID_CONFIG,    /* a BITNET_* environment value is malformed */
    BN_ERR_OUT_OF_MEMORY,     /* host allocation failed                    */
    BN_ERR_GPU_OUT_OF_MEMORY, /* device allocation failed                  */
    BN_ERR_IO,                /* a file could not be opened or read        */
    BN_ERR_FORMAT,            /* a file is malformed or truncated          */
    BN_ERR_UNSUPPORTED,       /* valid, but not supported by this build    */
    BN_ERR_NO_DEVICE,         /* the requested device is not usable        */
    BN_ERR_DRIVER,            /* GPU driver missing or too old             */
    BN_ERR_GPU,               /* any other GPU runtime failure             */
    BN_ERR_FAKE_GPU,          /* a fake GPU was configured in strict mode  */
    BN_ERR_INTERNAL,          /* a bug: please report it                   */
    BN_STATUS_COUNT
} bn_status;

#define BN_ERROR_MESSAGE_MAX 512
#define BN_ERROR_HINT_MAX 256

typedef struct bn_error {
    bn_status status;
    char message[BN_ERROR_MESSAGE_MAX]; /* what went wrong, with the details */
    char hint[BN_ERROR_HINT_MAX];       /* what to do about it ("" if none)  */
} bn_error;

/* Short stable name of a status, e.g. "invalid-config"; "unknown-status"
 * for a value outside [BN_OK, BN_STATUS_COUNT). */
const char *bn_status_str(bn_status status);

/* Clears an error record (status BN_OK, empty strings). NULL is allowed. */
void bn_error_clear(bn_error *err);

/* Fills err (if not NULL) and returns status, so callers can write
 * `return bn_error_set(err, BN_ERR_IO, "check the path", "cannot open %s", p);`
 * hint may be NULL; a NULL fmt makes the message the status's name. status
 * is stored and returned as given, even out of range. Message and hint are
 * cut to BN_ERROR_MESSAGE_MAX / BN_ERROR_HINT_MAX bytes. */
bn_status bn_error_set(bn_error *err, bn_status status, const char *hint,
                       const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;

/* Library version string, e.g. "0.1.0". */
const char *bn_version(void);

/* ------------------------------------------------------------------------ */
/* Logging (stderr). Level from BITNET_LOG=error|warn|info|debug.            */
/* ------------------------------------------------------------------------ */

typedef enum bn_log_level {
    BN_LOG_ERROR = 0,
    BN_LOG_WARN = 1,
    BN_LOG_INFO = 2,
    BN_LOG_DEBUG = 3
} bn_log_level;

/* A level outside [BN_LOG_ERROR, BN_LOG_DEBUG] is ignored: the current
 * level stays. */
void bn_log_set_level(bn_log_level level);
bn_log_level bn_log_get_level(void);
/* Prints one line when level is at most the current level; a level outside
 * [BN_LOG_ERROR, BN_LOG_DEBUG] or a NULL fmt prints nothing. */
void bn_log(bn_log_level level, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* ------------------------------------------------------------------------ */
/* Configuration from BITNET_* environment variables                         */
/* ------------------------------------------------------------------------ */

typedef enum bn_device_kind {
    BN_DEVICE_AUTO = 0, /* CUDA when usable, then a Vulkan GPU, else CPU */
    BN_DEVICE_CPU,
    BN_DEVICE_GPU,      /* any usable GPU backend                        */
    BN_DEVICE_CUDA,     /* CUDA; index -1 means the best device          */
    BN_DEVICE_VULKAN    /* Vulkan; index -1: the first GPU, else device 0 */
} bn_device_kind;

/* The most devices one request lists (cuda:N,M,...). */
#define BN_DEVICE_LIST_MAX 16

typedef struct bn_device_request {
    bn_device_kind kind;
    int index; /* cuda:N, vulkan:N -> N; a list's first device; otherwise -1 */
    /* Several CUDA devices, one replica of the model on each: cuda:N,M,...
     * gives count >= 2 and list[0 .. count) (a device may repeat: two
     * replicas on one GPU); cuda:all gives count -1 (every device found,
     * index 0). Otherwise count is 0. */
    int count;
    int list[BN_DEVICE_LIST_MAX];
} bn_device_request;

/* GPU backends that detection knows about (bit i of a mask = backend i). */
typedef enum bn_gpu_backend {
    BN_GPU_CUDA = 0,
    BN_GPU_ROCM,
    BN_GPU_METAL,
    BN_GPU_VULKAN,
    BN_GPU_OPENCL,
    BN_GPU_BACKEND_COUNT
} bn_gpu_backend;

/* Name of a backend: "cuda", "rocm", "metal", "vulkan", "opencl";
 * "unknown" for a value outside [0, BN_GPU_BACKEND_COUNT). */
const char *bn_gpu_backend_name(bn_gpu_backend backend);

typedef struct bn_config {
    bn_log_level log_level;          /* BITNET_LOG (default warn)            */
    bn_device_request device;        /* BITNET_DEVICE (default auto)         */
    bool gpu_fake_set;               /* BITNET_GPU_FAKE present (even "")    */
    unsigned gpu_fake_mask;          /* backends it names (1u << backend)    */
    bool strict_mode;                /* BITNET_STRICT_MODE                   */
    bool strict_no_fake_gpu;         /* BITNET_STRICT_NO_FAKE_GPU            */
    int num_threads;                 /* BITNET_NUM_THREADS (0 = all cores)   */
    int batch_size;                  /* BITNET_BATCH_SIZE (0 = default)      */
    uint64_t memory_limit_bytes;     /* BITNET_MEMORY_LIMIT (0 = no limit)   */
    bool deterministic;              /* BITNET_DETERMINISTIC                 */
    bool seed_set;                   /* BITNET_SEED present                  */
    uint64_t seed;                   /* BITNET_SEED                          */
    char kernel[16];                 /* BITNET_KERNEL ("" = best available)  */
    char model[1024];                /* BITNET_MODEL ("" = the default model) */
    char api_key[256];               /* BITNET_API_KEY ("" = none: bitnet serve) */
    bool vulkan_no_fp64;             /* BITNET_VULKAN_FP64=0: the Vulkan
                                        backend's kernels without fp64, as
                                        on a device that has none          */
    bool vulkan_no_dot;              /* BITNET_VULKAN_DOT=0: its W2A8
                                        products without integer dot
                                        products, as on a device without  */
    bool vulkan_no_screen;           /* BITNET_VULKAN_SCREEN=0: its greedy
                                        steps through the full LM head    */
    bool vulkan_no_matrix;           /* BITNET_VULKAN_MATRIX=0: its W2A8
                                        products of many rows without
                                        subgroup matrix products          */
} bn_config;

/* Defaults, as if no BITNET_* variable were set. cfg NULL does nothing. */
void bn_config_defaults(bn_config *cfg);

/* Reads and validates every BITNET_* variable. On a malformed value returns
 * BN_ERR_INVALID_CONFIG with a message naming the variable and the form it
 * accepts; cfg then holds the defaults plus the values parsed before it.
 * cfg NULL is BN_ERR_INVALID_ARGUMENT. */
bn_status bn_config_from_env(bn_config *cfg, bn_error *err);

/* Applies one NAME=value pair as if it came from the environment; the unit
 * of the parser, exposed for tests and for CLI flags that mirror variables.
 * An unknown BITNET_* name is BN_ERR_INVALID_CONFIG; a NULL cfg, name or
 * value is BN_ERR_INVALID_ARGUMENT. */
bn_status bn_config_set(bn_config *cfg, const char *name, const char *value, bn_error *err);

/* Names of every variable bn_config reads, NULL-terminated. */
const char *const *bn_config_variable_names(void);

/* The form a variable accepts, in words (as shown in error messages);
 * NULL for NULL or a name bn_config does not read. */
const char *bn_config_variable_accepted(const char *name);

/* Parses "2GB", "512MB", "1.5GiB", "4096" (bytes). Units are binary:
 * KB = KiB = 1024 bytes. Returns false on anything else, on overflow, or
 * when text or bytes is NULL; *bytes is then left as it was. */
bool bn_parse_memory_size(const char *text, uint64_t *bytes);

/* Parses "auto", "cpu", "gpu", "cuda", "cuda:N" (N below
 * BN_CUDA_MAX_DEVICES), "cuda:N,M,..." (2 to BN_DEVICE_LIST_MAX devices),
 * "cuda:all", "vulkan" or "vulkan:N". Returns false on anything else, or
 * when text or req is NULL; *req is then left as it was. */
bool bn_parse_device_request(const char *text, bn_device_request *req);

/* ------------------------------------------------------------------------ */
/* Aligned allocation, timers, backtraces                                    */
/* ------------------------------------------------------------------------ */

/* alignment must be a power of two and a multiple of sizeof(void *).
 * Returns NULL on failure, on bad alignment, and when size plus alignment
 * would not fit a size_t; size 0 returns a valid pointer. */
void *bn_aligned_alloc(size_t alignment, size_t size);
/* Frees what bn_aligned_alloc returned; NULL does nothing. */
void bn_aligned_free(void *ptr);

/* Monotonic clock, never goes backwards. */
uint64_t bn_time_ns(void);
double bn_time_seconds(void);

#define BN_BACKTRACE_MAX 32
typedef struct bn_backtrace {
    int depth;                   /* 0 in release builds */
    void *frames[BN_BACKTRACE_MAX];
} bn_backtrace;

/* Captures the caller's stack in debug builds (BITNET_DEBUG); a no-op that
 * records depth 0 otherwise, so it is cheap to call on hot paths. skip
 * drops that many innermost frames (negative = 0; more than the stack has
 * leaves depth 0). bt NULL does nothing. */
void bn_backtrace_capture(bn_backtrace *bt, int skip);
/* Writes one frame per line ("  #0 symbol+off (module)") into buf, cut to
 * size bytes and always NUL-terminated; buf NULL or size 0 does nothing.
 * bt->depth is clamped to [0, BN_BACKTRACE_MAX]; bt NULL, depth 0 and builds
 * without backtraces write a one-line "(no backtrace: ...)" note instead. */
void bn_backtrace_format(const bn_backtrace *bt, char *buf, size_t size);

/* ------------------------------------------------------------------------ */
/* Host memory                                                               */
/* ------------------------------------------------------------------------ */

typedef struct bn_host_memory {
    uint64_t process_resident_bytes; /* this process's resident set    */
    uint64_t process_peak_bytes;     /* its high-water mark            */
    uint64_t system_total_bytes;
    uint64_t system_available_bytes;
} bn_host_memory;

/* out NULL is BN_ERR_INVALID_ARGUMENT; BN_ERR_UNSUPPORTED where the system
 * totals cannot be read. */
bn_status bn_host_memory_query(bn_host_memory *out, bn_error *err);

/* ------------------------------------------------------------------------ */
/* CPU features                                                              */
/* ------------------------------------------------------------------------ */

typedef struct bn_cpu_features {
    char arch[16];      /* "x86_64", "aarch64", ...   */
    char model[128];    /* brand string when known    */
    int logical_cores;
    bool avx2, fma, f16c;
    bool avx512f, avx512bw, avx512vl, avx512vnni;
    bool avxvnni;       /* 256-bit VNNI (AVX-VNNI)    */
    bool neon, dotprod; /* aarch64 ASIMD and SDOT/UDOT */
} bn_cpu_features;

/* Detected once at first use: cpuid + xgetbv on x86 (the OS must have
 * enabled the registers too), hwcaps on aarch64. */
const bn_cpu_features *bn_cpu_features_get(void);

/* ------------------------------------------------------------------------ */
/* CUDA devices                                                              */
/* ------------------------------------------------------------------------ */

typedef struct bn_cuda_device {
    int id;
    char name[256];
    int cc_major, cc_minor;
    uint64_t total_memory_bytes;
    uint64_t free_memory_bytes;
    int sm_count;
    int max_threads_per_block;
    int max_threads_per_sm;
    int warp_size;
    uint64_t shared_mem_per_block;        /* default limit          */
    uint64_t shared_mem_per_block_optin;  /* limit after opting in  */
    uint64_t shared_mem_per_sm;
    uint64_t l2_cache_bytes;
    int memory_clock_khz;
    int memory_bus_width_bits;
    double memory_bandwidth_gbs;          /* theoretical peak, GB/s (1e9) */
    char pci_bus_id[32];
    /* Derived from the compute capability (bn_cuda_device_derive_caps). */
    bool fp16;              /* fast fp16 arithmetic, cc >= 6.1     */
    bool bf16;              /* cc >= 8.0                           */
    bool int8_dot;          /* dp4a int8 dot product, cc >= 6.1    */
    bool tensor_cores;      /* cc >= 7.0                           */
    bool int8_tensor_cores; /* cc >= 7.2                           */
    bool fp8;               /* cc >= 8.9                           */
    /* Peer access (P2P): bit j set when this device reads and writes the
     * memory of CUDA device j directly (cudaDeviceCanAccessPeer). */
    uint64_t peer_mask;
} bn_cuda_device;

#define BN_CUDA_MAX_DEVICES 64

typedef struct bn_cuda_report {
    bool compiled;          /* this build includes CUDA                     */
    int driver_version;     /* e.g. 13000 for 13.0; 0 when no driver        */
    int runtime_version;    /* version of the runtime linked in; 0 if none  */
    int device_count;
    bn_cuda_device devices[BN_CUDA_MAX_DEVICES];
    bn_status status;       /* BN_OK when at least one device was queried   */
    char reason[BN_ERROR_MESSAGE_MAX]; /* why CUDA is unusable, if it is    */
    char hint[BN_ERROR_HINT_MAX];
} bn_cuda_report;

/* Queries every visible CUDA device. Never fails hard: a missing driver or
 * no device is reported in report->status and report->reason. report NULL
 * does nothing. */
void bn_cuda_query(bn_cuda_report *report);

/* Fills the derived capability flags from cc_major/cc_minor, compared as
 * the pair (major, minor): 7.100 is below 8.0, 8.-1 is below 8.0. dev NULL
 * does nothing. */
void bn_cuda_device_derive_caps(bn_cuda_device *dev);

/* Theoretical peak bandwidth in GB/s (1e9 bytes/s) of a double-data-rate
 * memory: 2 transfers per clock over the whole bus. 0 when either input is
 * 0 or negative. */
double bn_cuda_memory_bandwidth_gbs(int memory_clock_khz, int bus_width_bits);

/* Index of the best device (most memory, then most SMs); -1 when devs is
 * NULL or n <= 0. */
int bn_cuda_best_device(const bn_cuda_device *devs, int n);

/* Kernel launch parameters.
 *
 * Rules, in order:
 *  1. block = preferred_block (256 when 0), at most max_threads_per_block;
 *  2. shared memory: shared_fixed + block * shared_per_thread must fit the
 *     block limit (the opt-in limit when the device has one), so block
 *     shrinks to fit; it is an error if even one warp does not fit;
 *  3. block is rounded down to a multiple of the warp size;
 *  4. grid = ceil(n_work / block);
 *  5. while grid < 4 blocks per SM and block > 64, halve block (and grow
 *     grid) so that small problems still spread over every SM.
 *
 * BN_ERR_INVALID_ARGUMENT when dev or out is NULL, n_work is 0, the device
 * record has a warp_size, sm_count or max_threads_per_block of 0 or less
 * (or fewer threads per block than a warp), one warp's shared memory does
 * not fit (sums that would pass 2^64 included), or the grid would exceed
 * 2^31 - 1 blocks (CUDA's grid.x limit; split the work). Any n_work up to
 * UINT64_MAX is handled without overflow. out is written only on BN_OK.
 */
typedef struct bn_launch_params {
    unsigned block;          /* threads per block            */
    unsigned grid;           /* blocks                       */
    uint64_t shared_bytes;   /* dynamic shared memory bytes  */
    bool needs_optin;        /* shared_bytes > default limit */
} bn_launch_params;

bn_status bn_launch_params_compute(const bn_cuda_device *dev, uint64_t n_work,
                                   unsigned preferred_block, uint64_t shared_per_thread,
                                   uint64_t shared_fixed, bn_launch_params *out,
                                   bn_error *err);

/* ------------------------------------------------------------------------ */
/* GPU detection                                                             */
/* ------------------------------------------------------------------------ */

typedef struct bn_gpu_backend_info {
    bn_gpu_backend backend;
    bool available;        /* usable for compute (or faked)               */
    bool fake;             /* from BITNET_GPU_FAKE, never used to compute */
    int device_count;
    char version[96];      /* versions that could be read, "" otherwise   */
    char detail[384];      /* devices found, or why it is unavailable     */
} bn_gpu_backend_info;

typedef struct bn_gpu_info {
    bn_gpu_backend_info backends[BN_GPU_BACKEND_COUNT];
    bool fake_override;          /* BITNET_GPU_FAKE replaced detection     */
    bool fake_ignored;           /* it was set but strict mode ignored it  */
    bn_cuda_report cuda;         /* real CUDA query (empty when faked)     */
    char nvcc_version[32];       /* "13.0" when nvcc is on PATH            */
    char rocm_smi_version[64];   /* when rocm-smi is on PATH               */
    bool preflight_ok;           /* a real GPU is ready for compute        */
    char preflight[512];         /* actionable one-line verdict            */
    char summary[1024];          /* one paragraph for people               */
} bn_gpu_info;

/* Detects every GPU backend under cfg (NULL = read the environment).
 * Returns BN_ERR_FAKE_GPU when BITNET_STRICT_NO_FAKE_GPU=1 and a fake is
 * configured, BN_ERR_INVALID_CONFIG on a malformed environment,
 * BN_ERR_INVALID_ARGUMENT when info is NULL. Bits of cfg->gpu_fake_mask
 * beyond BN_GPU_BACKEND_COUNT are ignored. Missing drivers are not errors:
 * they are reported in the info. */
bn_status bn_gpu_detect(const bn_config *cfg, bn_gpu_info *info, bn_error *err);

/* True when any GPU backend is available in info (fakes count unless
 * strict mode removed them); false when info is NULL. */
bool bn_gpu_info_available(const bn_gpu_info *info);

/* Detects under the environment's configuration; false on any error. */
bool bn_gpu_available(void);

/* ------------------------------------------------------------------------ */
/* Kernels                                                                   */
/* ------------------------------------------------------------------------ */

#define BN_KERNEL_PROVIDERS_MAX 16

/* A kernel provider: one implementation of the ternary matrix kernels the
 * CPU backend computes with (scalar, avx2, avx512, avx512vnni, neon,
 * neondot; cuda in CUDA builds). */
typedef struct bn_kernel_provider_info {
    char name[16];       /* the name BITNET_KERNEL takes                  */
    int priority;        /* higher is preferred                           */
    bool available;      /* it runs here: the CPU has its instructions
                            (a device provider: a usable GPU)             */
    bool device;         /* computes on a GPU; chosen only when
                            BITNET_KERNEL names it                        */
    bool selected;       /* the provider the CPU backend computes with    */
} bn_kernel_provider_info;

typedef struct bn_kernel_report {
    int n_providers;     /* compiled into this build, best first          */
    bn_kernel_provider_info providers[BN_KERNEL_PROVIDERS_MAX];
    /* BN_OK when a provider is selected; otherwise why none is (with the
     * message), e.g. BITNET_KERNEL naming one this CPU cannot run. */
    bn_status selection_status;
    char selection_error[BN_ERROR_MESSAGE_MAX];
} bn_kernel_report;

/* The kernel providers this build has and which one computes: BITNET_KERNEL
 * when set, else the available CPU provider of the highest priority,
 * decided once per process. Never fails hard: a failed selection is
 * reported in the record. report NULL does nothing. Thread safety: any
 * thread. */
void bn_kernel_query(bn_kernel_report *report);

/* The CUDA kernel families this build contains, one line each ("name:
 * what it does (source file)"), in a NULL-terminated list that lives as
 * long as the program; the list is empty (only the NULL) in builds
 * without CUDA. */
const char *const *bn_cuda_kernel_families(void);

/* The Vulkan devices (builds with the Vulkan compute layer, docs/VULKAN.md):
 * each with the limits kernels are sized by. */
#define BN_VULKAN_MAX_DEVICES 8
typedef struct bn_vulkan_device {
    char name[256];
    char type[16];                     /* "discrete", "integrated", "virtual",
                                          "cpu" (lavapipe), "other"          */
    uint32_t api_version;              /* Vulkan's packed version number     */
    uint64_t device_local_bytes;       /* the largest device-local heap      */
    uint32_t max_workgroup_invocations, max_shared_bytes, subgroup_size;
    uint64_t max_storage_buffer_range; /* the largest buffer a kernel binds  */
    bool integer_dot_product;          /* VK_KHR_shader_integer_dot_product  */
    bool fp64;                         /* shaderFloat64                      */
    bool subgroup_arithmetic;          /* subgroup add / max in compute      */
    uint32_t int8_matrix[3];           /* M, N, K of the subgroup int8 matrix
                                          product the W2A8 kernels take
                                          (VK_NV_cooperative_matrix); zeros
                                          where there is none                */
} bn_vulkan_device;

typedef struct bn_vulkan_report {
    bool compiled;                     /* this build has the compute layer   */
    int device_count;                  /* devices listed                     */
    bn_vulkan_device devices[BN_VULKAN_MAX_DEVICES];
    char reason[256];                  /* why there are none                 */
} bn_vulkan_report;

/* Lists the Vulkan devices through the loader (opened at run time). Never
 * fails hard: no loader, no driver or a build without Vulkan leave
 * device_count 0 and say why in reason. report NULL does nothing. */
void bn_vulkan_query(bn_vulkan_report *report);

/* ======================================================================== */
/* Models, sessions, generation                                             */
/* ======================================================================== */
/*
 * A bn_model is a model loaded for computing: its weights on the device the
 * request chose (the GPU when one is usable, else the CPU), its tokenizer
 * and its KV cache. A bn_session is one conversation's tokens: several
 * sessions share one model, each with its own history. Generating in a
 * session continues from everything the session holds; the model reuses
 * the positions its cache already holds for the session's tokens (a
 * session that goes on, or one that starts with the same tokens as the
 * last one computed) and computes the rest.
 *
 * Thread safety: functions on one bn_model may be called from any threads;
 * computation on one model (generation, evaluation, perplexity) runs one
 * call at a time, the others waiting. A model of max_sequences > 1 on a
 * device that batches runs generations together instead: each
 * bn_session_generate or bn_generate_batch call queues its requests for
 * the model's scheduler thread, which runs them in shared passes with
 * whatever else is running, and returns when they end; their callbacks are
 * then called from that thread (one at a time; a callback must not call
 * into the same model). A session must be used by one thread at a time,
 * except bn_session_cancel, which any thread may call at any time.
 * Distinct models are independent.
 *
 *     bn_model *m;
 *     bn_model_options o;
 *     bn_model_options_default(&o);             // the shipped model, auto device
 *     if (bn_model_open(&o, &m, &err) != BN_OK) ...
 *     bn_session *s;
 *     bn_session_create(m, &s, &err);
 *     bn_generate_params p;
 *     bn_generate_params_default(&p);           // greedy, 128 tokens at most
 *     p.prompt = "The LORD is my shepherd";
 *     bn_session_generate(s, &p, on_token, NULL, &result, &err);
 *
 * docs/API.md describes every call with a worked example.
 */

typedef struct bn_model bn_model;
typedef struct bn_session bn_session;

/* The model bn_model_open loads when no path is given: BITNET_MODEL when
 * set, else the model shipped with bitnet (models/bitnet-kjv-7m), looked for
 * beside the running program and the library (PREFIX/share/bitnet/models
 * for PREFIX/bin or PREFIX/lib, models/ at the top of a build tree) and in
 * the source tree the library was built from. BN_ERR_IO naming the places
 * looked at when none holds it. */
bn_status bn_default_model_path(char *buf, size_t size, bn_error *err);

typedef enum bn_kv_precision {
    BN_KV_F32 = 0, /* the CPU's numbers (default)                            */
    BN_KV_F16,     /* CUDA: half the cache's memory; logits within ~3e-2 of
                      their range of the f32 cache's (the CPU keeps f32)     */
    BN_KV_FP8      /* CUDA: the batching engine's paged cache in fp8 e4m3 (a
                      quarter of f32's memory and reads; docs/CUDA.md says
                      what it costs in accuracy), one sequence's in f16      */
} bn_kv_precision;

/* Which cached prefix block of the paged KV cache is given up first. */
typedef enum bn_kv_evict {
    BN_KV_EVICT_LRU = 0, /* the one released or reused longest ago (default) */
    BN_KV_EVICT_FIFO,    /* the one filled first                             */
    BN_KV_EVICT_LFU      /* the one the fewest sequences used, then LRU      */
} bn_kv_evict;

/* The most rows bn_model_options.batch_tokens may give a shared pass. */
#define BN_BATCH_TOKENS_MAX 1048576

typedef struct bn_model_options {
    /* A GGUF file (bitnet.cpp's or llama.cpp's) or a Hugging Face model
     * directory; NULL: BITNET_MODEL, else the model shipped with bitnet. */
    const char *path;
    /* "auto" (a usable CUDA GPU, else the CPU), "cpu", "gpu", "cuda",
     * "cuda:N"; NULL: BITNET_DEVICE, else "auto". */
    const char *device;
    int n_threads;            /* CPU threads; 0: BITNET_NUM_THREADS, else all */
    int64_t n_ctx;            /* positions a session may hold; 0: the model's
                                 training context (at most that)             */
    bn_kv_precision kv;       /* BN_KV_F32                                   */
    /* GPU memory the model may take, bytes; 0: BITNET_MEMORY_LIMIT, else
     * what the device has free. */
    uint64_t memory_limit_bytes;
    /* Many sequences at once (bn_generate_batch): how many run together
     * in shared forward passes (0 or 1: one at a time). Their KV cache is
     * paged: kv_cache_bytes in all (0: room for max_sequences full
     * contexts), in blocks of kv_block_size positions (0: 32); blocks of a
     * prompt prefix already computed are shared by later sequences unless
     * no_prefix_sharing, and kept after their sequence ends until the
     * cache needs them, the first given up chosen by kv_evict. Where the
     * device cannot batch (a CUDA model whose head size is not 64 or 128),
     * batches run one request at a time. */
    int max_sequences;
    uint64_t kv_cache_bytes;
    int kv_block_size;
    bn_kv_evict kv_evict;
    bool no_prefix_sharing;
    /* CUDA GPUs that split the model between them (tensor parallelism
     * through NCCL: each holds its share of the heads and FFN columns);
     * 0 or 1: none. `device` names them ("cuda:0,1", exactly this many) or,
     * as "cuda", "gpu" or "auto", takes the first this many. Sequences run
     * one at a time. */
    int tensor_parallel;
    /* Many sequences at once: a shared pass holds one row for every
     * decoding sequence, then chunks of prompts until it has batch_tokens
     * rows (0: 512; at most BN_BATCH_TOKENS_MAX). More rows a pass admit
     * prompts sooner (earlier first tokens, more sequences decoding
     * together) and make each pass, so each sequence's next token, slower
     * (docs/PERFORMANCE.md, "GPU, many sequences at once"). */
    int batch_tokens;
} bn_model_options;

/* Defaults: every field 0 / NULL, as documented above. */
void bn_model_options_default(bn_model_options *opt);

/* Loads the model and prepares the device. opt NULL: the defaults. Errors:
 * BN_ERR_IO / BN_ERR_FORMAT / BN_ERR_UNSUPPORTED for a file that cannot be
 * read or used, BN_ERR_NO_DEVICE / BN_ERR_DRIVER for a device request that
 * cannot be met, BN_ERR_OUT_OF_MEMORY / BN_ERR_GPU_OUT_OF_MEMORY,
 * BN_ERR_INVALID_CONFIG for a malformed BITNET_* variable. */
bn_status bn_model_open(const bn_model_options *opt, bn_model **out, bn_error *err);
/* Frees the model. Its sessions must be freed first; NULL is allowed. */
void bn_model_close(bn_model *m);

typedef struct bn_model_info {
    char path[1024];          /* the file or directory loaded                */
    char architecture[32];    /* "bitnet-b1.58"                              */
    char flavour[256];        /* what kind of file it is, in words           */
    char device[64];          /* "cpu", "cuda:0"; replicas: "cuda:0,1"        */
    char device_name[128];    /* "NVIDIA H200", or the CPU kernels ("avx512") */
    char chat_template[32];   /* the chat format (bn_model_apply_chat), ""
                                 when the model has none                     */
    int32_t vocab_size;
    int64_t n_ctx;            /* positions a session may hold                */
    int64_t n_ctx_train;      /* the context the model was trained for       */
    int n_layer, dim, n_head, n_head_kv, head_dim, ffn_dim;
    uint64_t n_params;
    bool has_tokenizer;       /* text in and out; else token ids only        */
    int32_t bos, eos, eot;    /* special tokens; -1 when the model has none  */
    /* How the device was chosen, one line: "requested=auto
     * detected=[cuda,avx512,scalar] selected=cuda:0 (NVIDIA H200, ...)". */
    char selection[512];
    /* Why an "auto" request computes on the CPU although a GPU was found
     * (the GPU backend could not start, or a GPU step failed and the CPU
     * took over), "" otherwise. */
    char fallback[576];
} bn_model_info;

bn_status bn_model_get_info(const bn_model *m, bn_model_info *info, bn_error *err);

/* What the model holds and has done since it was opened (bitnet run
 * --verbose prints these; the receipt records them). */
typedef struct bn_model_stats {
    double load_seconds;          /* reading the model and building the backend  */
    int threads;                  /* CPU threads computing; 0 on a GPU           */
    uint64_t model_weight_bytes;  /* the model's own tensors, mapped or held     */
    /* What the backend computing holds: its weights (on a GPU everything
     * uploaded: projections, embedding, LM head, norms), KV cache, scratch. */
    uint64_t weights_bytes, kv_cache_bytes, scratch_bytes, total_bytes;
    char kernels[512];            /* the kernels that ran, comma-separated       */
    /* On a GPU (gpu true): the device's part by part, and its work. */
    bool gpu;
    bool gpu_graphs;              /* decode steps replay a CUDA graph            */
    char kv_type[8];              /* "f32" or "f16"                              */
    uint64_t gpu_weights_bytes, gpu_embedding_bytes, gpu_lm_head_bytes,
        gpu_lm_head_screen_bytes, gpu_norms_bytes, gpu_kv_cache_bytes, gpu_scratch_bytes,
        gpu_total_bytes, gpu_peak_bytes;
    uint64_t gpu_device_total_bytes, gpu_device_free_bytes; /* free: after loading */
    /* The device memory pool every GPU buffer comes from: bytes it holds
     * from the driver now and at most, the limit it enforces
     * (BITNET_MEMORY_LIMIT; 0: none), buffers handed out, allocations and
     * refused requests. */
    uint64_t gpu_pool_reserved_bytes, gpu_pool_peak_reserved_bytes, gpu_pool_limit_bytes;
    uint64_t gpu_pool_buffers, gpu_pool_allocations, gpu_pool_failures;
    uint64_t gpu_kernel_launches, gpu_h2d_transfers, gpu_h2d_bytes, gpu_d2h_transfers,
        gpu_d2h_bytes;
    /* Batches (bn_generate_batch), where the device batches: sequences at
     * once, the paged cache's blocks (all, and cached: prefixes kept for
     * later prompts), forward passes and their rows so far, and
     * sequences preempted for want of blocks. */
    int max_sequences, kv_block_size;
    int32_t kv_blocks, kv_blocks_held, kv_blocks_cached; /* held: by running sequences */
    uint64_t batch_steps, batch_rows, batch_preemptions;
    /* Seconds the scheduler's thread spent in those passes' forward, and
     * after them handing out their tokens (sampling on the host, the token
     * callbacks): the second is time the device waits. */
    double batch_forward_seconds, batch_token_seconds;
} bn_model_stats;

/* Thread safety: as bn_model_get_info (it waits for a computation running). */
bn_status bn_model_get_stats(bn_model *m, bn_model_stats *stats, bn_error *err);

/* Whether token is one that ends a generation (end of text, end of turn). */
bool bn_model_token_is_eog(const bn_model *m, int32_t token);

/* ---- tokens ------------------------------------------------------------- */

/* The tokens of text[0, len) (BOS first when add_bos, the tokenizer asks
 * for it and the text does not start with it; special tokens written in
 * the text, such as <|eot_id|>, are read as those tokens). *n receives the number of tokens the text has; at most
 * cap of them are written to tokens (which may be NULL when cap is 0), so a
 * caller may ask for the count first. BN_ERR_INVALID_ARGUMENT for a model
 * without a tokenizer. */
bn_status bn_model_tokenize(const bn_model *m, const char *text, size_t len, bool add_bos,
                            int32_t *tokens, size_t cap, size_t *n, bn_error *err);

/* The text of tokens[0, n): *len receives its length in bytes; at most cap
 * bytes are written to buf, then a NUL when there is room (buf may be NULL
 * when cap is 0). Special tokens give their text ("<|eot_id|>"). Bytes of
 * a character the tokens cut are written as they are. */
bn_status bn_model_detokenize(const bn_model *m, const int32_t *tokens, size_t n, char *buf,
                              size_t cap, size_t *len, bn_error *err);

/* ---- chat ----------------------------------------------------------------- */

typedef struct bn_chat_message {
    const char *role;    /* "system", "user" or "assistant" */
    const char *content;
} bn_chat_message;

/* The text of a conversation in the model's chat format (bn_model_info's
 * chat_template), ending with the opening of the assistant's turn when
 * add_assistant, ready for bn_session_generate's prompt. *len and the
 * buffer as bn_model_detokenize. BN_ERR_UNSUPPORTED for a model without a
 * chat format, BN_ERR_INVALID_ARGUMENT for an unknown role. */
bn_status bn_model_apply_chat(const bn_model *m, const bn_chat_message *messages, size_t n,
                              bool add_assistant, char *buf, size_t cap, size_t *len,
                              bn_error *err);

/* ---- sessions --------------------------------------------------------------- */

bn_status bn_session_create(bn_model *m, bn_session **out, bn_error *err);
/* NULL is allowed. */
void bn_session_free(bn_session *s);

/* The tokens the session holds (prompts and generated tokens, in order):
 * *n receives their count; at most cap are written. */
bn_status bn_session_tokens(const bn_session *s, int32_t *tokens, size_t cap, size_t *n,
                            bn_error *err);
/* Forgets every token. */
void bn_session_reset(bn_session *s);
/* Keeps the first n tokens (n at most the count it holds). */
bn_status bn_session_truncate(bn_session *s, size_t n, bn_error *err);
/* A new session on the same model holding the first n tokens of src
 * (SIZE_MAX: all of them). */
bn_status bn_session_copy(const bn_session *src, size_t n, bn_session **out, bn_error *err);

/* Stops the generation running in s (from any thread) after the token in
 * progress, or before its first token when it comes during the prompt or
 * while the call waits for the model; it returns BN_OK with stop reason
 * BN_STOP_CANCELLED. A cancel before a generation is called does not
 * affect it. */
void bn_session_cancel(bn_session *s);

/* ---- generation ------------------------------------------------------------- */

#define BN_MAX_STOP_STRINGS 16
#define BN_MAX_TOP_LOGPROBS 20

/* A token and its log-probability under the model: the log-softmax of the
 * logits at its position, before any sampling setting changes them. */
typedef struct bn_token_logprob {
    int32_t token;
    float logprob;
} bn_token_logprob;

/* Called once for each generated token, before its text: its
 * log-probability, and the top_logprobs most likely tokens of its position
 * (best first, ties to the lower id). */
typedef void (*bn_logprob_callback)(void *user, int32_t token, float logprob,
                                    const bn_token_logprob *top, int n_top);

typedef struct bn_generate_params {
    /* What to append to the session before generating: text (tokenized
     * with BOS first when the session is empty and the tokenizer asks for
     * it), or token ids used as they are (n_prompt_tokens of them); both
     * NULL: continue from what the session holds (it must hold a token). */
    const char *prompt;
    const int32_t *prompt_tokens;
    size_t n_prompt_tokens;
    int max_tokens;          /* tokens to generate at most (>= 1; default 128) */
    /* Sampling, in this order: repetition penalty over the last
     * repeat_last_n tokens, top-k, temperature, top-p, min-p, a draw. */
    float temperature;       /* 0: greedy, the most likely token (default)  */
    int top_k;               /* 0: off (default 40)                         */
    float top_p;             /* 1: off (default 0.95)                       */
    float min_p;             /* 0: off (default 0.05)                       */
    float repeat_penalty;    /* 1: off (default)                            */
    int repeat_last_n;       /* default 64; -1: the whole session           */
    uint64_t seed;           /* the sampler's seed (default 0): the same
                                seed, prompt and settings give the same text */
    /* Generation stops before any of these strings: the text streamed
     * ends before it (the tokens that wrote it stay in the session). NULL
     * entries end the list early; empty strings are refused. */
    const char *stop[BN_MAX_STOP_STRINGS];
    /* Keep going past end-of-generation tokens (benchmarks). */
    bool ignore_eog;
    /* When not NULL: vocab_size floats, written with the logits after the
     * prompt (before sampling changes them). */
    float *prompt_logits;
    /* When not NULL: every generated token's log-probability, with the
     * top_logprobs (0 to BN_MAX_TOP_LOGPROBS) most likely tokens, called
     * with bn_session_generate's user. The tokens are then chosen on the
     * host, where the logits are (the same tokens). */
    bn_logprob_callback on_logprobs;
    int top_logprobs;
} bn_generate_params;

void bn_generate_params_default(bn_generate_params *p);

typedef enum bn_stop_reason {
    BN_STOP_MAX_TOKENS = 0, /* max_tokens generated                        */
    BN_STOP_EOG,            /* an end-of-generation token (not kept)       */
    BN_STOP_STRING,         /* one of params.stop                          */
    BN_STOP_CALLBACK,       /* the callback returned false                 */
    BN_STOP_CANCELLED       /* bn_session_cancel                           */
} bn_stop_reason;

/* Called once for each generated token with the text it completes, in
 * whole UTF-8 characters: empty while a character is incomplete, and text
 * a stop string might start withheld until it is decided. Returning false
 * stops the generation after this token. At the end, text still held back
 * (the start of a stop string that did not come, bytes of an incomplete
 * character) comes in one more call with token -1, whose return value is
 * ignored. Concatenated, the calls' texts are the generated text. */
typedef bool (*bn_token_callback)(void *user, int32_t token, const char *text, size_t len);

typedef struct bn_generate_result {
    size_t n_prompt_tokens;   /* tokens appended before generating           */
    size_t n_cached;          /* of the session's tokens, positions the cache
                                 already held (not computed again)          */
    size_t n_tokens;          /* tokens generated and kept in the session    */
    bn_stop_reason stop;
    double prompt_seconds;    /* computing the prompt's positions            */
    double generate_seconds;  /* from then to the last token                 */
    int64_t decode_steps;     /* single-token forward passes                 */
    double decode_seconds;    /* time inside them                            */
} bn_generate_result;

/* Appends the prompt to the session and generates up to max_tokens tokens,
 * each kept in the session (an end-of-generation token is not). The text
 * goes to on_token (NULL: not streamed); result may be NULL. The prompt
 * and the tokens to generate must fit the model's n_ctx with what the
 * session holds, else BN_ERR_INVALID_ARGUMENT before anything is computed
 * (the session unchanged). On any error the session is as before the call.
 * BN_ERR_FORMAT when the model's logits are not finite. */
bn_status bn_session_generate(bn_session *s, const bn_generate_params *p,
                              bn_token_callback on_token, void *user, bn_generate_result *result,
                              bn_error *err);

/* ---- many sequences at once ------------------------------------------------- */

/* One request of a batch: as bn_session_generate(item.session, item.params,
 * item.on_token, item.user, &item.result, &item.error), with item.status
 * its outcome. */
typedef struct bn_batch_item {
    bn_session *session;             /* distinct for every item of a batch  */
    const bn_generate_params *params;
    bn_token_callback on_token;      /* may be NULL                        */
    void *user;
    bn_generate_result result;       /* out                                */
    bn_status status;                /* out: this item's own outcome       */
    bn_error error;                  /* out                                */
} bn_batch_item;

/* Generates for every item, up to bn_model_options.max_sequences of them at
 * once in shared forward passes (continuous batching: an item starts as
 * soon as a running one ends; a prompt's prefix computed before is taken
 * from the paged cache). Each item's text and tokens are those its own
 * bn_session_generate gives, its callbacks called as its tokens come (from
 * the model's scheduler thread where it batches: Thread safety above). An item that cannot run (a prompt beyond the context or the
 * whole cache, bad parameters) fails alone; the others go on. The call's
 * status is an error only when the batch as a whole cannot run (NULL
 * arguments, a session twice, a device failure: then every item not done
 * fails with it). Thread safety: as bn_session_generate, for every session
 * in the batch. */
bn_status bn_generate_batch(bn_model *m, bn_batch_item *items, size_t n, bn_error *err);

/* Writes a JSON receipt of the session's last generation (bitnet run
 * --receipt; the fields are in docs/CLI.md): the model, the device and
 * how it was chosen, the prompt's and generated tokens, the sampling, the
 * timings and the memory. BN_ERR_INVALID_ARGUMENT when the session has not
 * generated; BN_ERR_IO when writing fails. */
typedef struct bn_receipt_options {
    const char *command;   /* recorded as "command" ("run")               */
    bool chat;             /* the prompt was formatted as a chat           */
    bool seed_fixed;       /* the seed was chosen, not drawn at random     */
} bn_receipt_options;
bn_status bn_session_write_receipt(const bn_session *s, const bn_receipt_options *o, FILE *out,
                                   bn_error *err);

/* Appends tokens[0, n) to the session, computes them and writes the logits
 * that predict the next token (vocab_size floats) to logits. */
bn_status bn_session_eval(bn_session *s, const int32_t *tokens, size_t n, float *logits,
                          bn_error *err);

/* ---- perplexity --------------------------------------------------------------- */

typedef struct bn_perplexity {
    double perplexity;         /* exp(mean_nll)                               */
    double mean_nll;           /* nats per predicted token                    */
    int64_t n_predicted;       /* tokens scored                               */
    int64_t n_text_tokens;     /* tokens of the whole text                    */
    int64_t n_chunks;
    int64_t ctx;               /* positions per chunk, BOS included           */
    double seconds;
} bn_perplexity;

/* Called after each chunk with the result so far. */
typedef void (*bn_perplexity_progress)(void *user, int64_t chunk, int64_t n_chunks,
                                       const bn_perplexity *so_far);

/* Perplexity of text[0, len) (the text tokenized as a whole, cut into chunks
 * of ctx positions, BOS first in each: bitnet perplexity's rule; ctx 0:
 * 512, or n_ctx if smaller). progress may be NULL. It uses the model's
 * cache: sessions' cached positions are computed again afterwards.
 * BN_ERR_INVALID_ARGUMENT for a ctx out of range or a text of too few
 * tokens; BN_ERR_FORMAT when the model's logits are not finite. */
bn_status bn_model_perplexity(bn_model *m, const char *text, size_t len, int64_t ctx,
                              bn_perplexity_progress progress, void *user, bn_perplexity *out,
                              bn_error *err);

/* ------------------------------------------------------------------------ */
/* Inspecting model files                                                    */
/* ------------------------------------------------------------------------ */

typedef struct bn_inspect_options {
    bool json; /* one JSON object instead of the text report (false) */
} bn_inspect_options;

/* Writes to out what the model at path holds, runnable or not (bitnet
 * inspect prints it):
 *   - a GGUF file: the header, every metadata key and value (arrays of
 *     more than 16 values summarised as "[N strings]"; in the text report
 *     strings cut at 160 bytes) and the tensor table (name, shape, type,
 *     bytes, offset);
 *   - a Hugging Face directory: its config.json, tokenizer.json and
 *     tensors;
 *   - a .safetensors file: its tensors;
 * then whether bitnet can run it, with the flavour, hyper-parameters and
 * tokenizer, or why not. opt NULL: the text report. A file bitnet cannot
 * run is reported, not an error. Errors, with nothing written: BN_ERR_IO
 * for a path that cannot be opened or a directory without config.json,
 * BN_ERR_FORMAT / BN_ERR_UNSUPPORTED for a file that is not valid GGUF or
 * safetensors; and BN_ERR_IO when writing to out fails. Thread safety: any
 * thread; the call reads the files itself and shares nothing. */
bn_status bn_inspect(const char *path, const bn_inspect_options *opt, FILE *out, bn_error *err);

/* ------------------------------------------------------------------------ */
/* Converting models                                                         */
/* ------------------------------------------------------------------------ */
/*
 * A Hugging Face BitNet b1.58 directory (config.json, tokenizer.json and
 * the weights as *.safetensors: a packed ternary checkpoint or bf16 master
 * weights) written as one GGUF file in the conventions of the runtime that
 * reads it (bitnet convert). The file computes what the directory does, up
 * to the fp16 rounding of the scales in the llama.cpp encodings.
 */

typedef enum bn_convert_type {
    BN_CONVERT_I2_S = 0, /* Microsoft bitnet.cpp (architecture bitnet-25): I2_S
                            projections, F16 token embedding, F32 norms    */
    BN_CONVERT_TQ2_0,    /* llama.cpp (architecture bitnet): TQ2_0 projections,
                            F16 embedding                                  */
    BN_CONVERT_TQ1_0,    /* llama.cpp: TQ1_0 projections (1.69 bits/weight) */
    BN_CONVERT_F16       /* llama.cpp: projections as F16 values (code x scale) */
} bn_convert_type;

/* "i2_s", "tq2_0", "tq1_0" or "f16" to *out; false for any other name or
 * a NULL argument (*out is then left as it was). */
bool bn_convert_type_parse(const char *name, bn_convert_type *out);
/* The name bn_convert_type_parse reads; "unknown" for a value outside the
 * enum. */
const char *bn_convert_type_name(bn_convert_type type);

/* Progress of a conversion: stage "packing" (done and total count
 * tensors), then "writing" (bytes). */
typedef void (*bn_convert_progress)(void *user, const char *stage, uint64_t done,
                                    uint64_t total);

typedef struct bn_convert_options {
    bn_convert_type type;         /* BN_CONVERT_I2_S                        */
    bn_convert_progress progress; /* NULL: none                             */
    void *user;                   /* passed to progress                     */
} bn_convert_options;

/* Defaults: I2_S, no progress (every field 0 / NULL). */
void bn_convert_options_default(bn_convert_options *opt);

typedef struct bn_convert_report {
    char architecture[32]; /* general.architecture written: "bitnet-25" or "bitnet" */
    int n_tensors;
    int n_ternary;         /* projections in the requested encoding       */
    int n_f16_fallback;    /* projections written as F16 instead: their rows
                              do not fit the encoding's blocks of 256     */
    uint64_t file_bytes;
} bn_convert_report;

/* Converts the directory hf_dir to the GGUF file out_path. opt NULL: the
 * defaults; report (may be NULL) is filled on success, zeroed otherwise.
 * The file is written under a temporary name of its own beside out_path,
 * synced and renamed over it when complete, so out_path never holds a
 * partial file. Errors: BN_ERR_INVALID_ARGUMENT for a NULL path, an
 * unknown type or an hf_dir that is not a directory; BN_ERR_IO when hf_dir
 * cannot be opened or has no config.json, or when out_path exists and is
 * not a regular file (refused before any work) or cannot be written;
 * BN_ERR_FORMAT / BN_ERR_UNSUPPORTED for a directory that is not a BitNet
 * model bitnet reads, and when a value the encoding stores as F16 is
 * beyond F16's range (the file would not load). Thread safety: any
 * thread; conversions share nothing but the table of temporary files
 * below. */
bn_status bn_convert_hf_to_gguf(const char *hf_dir, const char *out_path,
                                const bn_convert_options *opt, bn_convert_report *report,
                                bn_error *err);

/* Removes the temporary files the conversions running in this process are
 * writing. Async-signal-safe (lock-free atomics and unlink only), for the
 * SIGINT / SIGTERM handler a program installs itself: the handler calls
 * this, then re-raises the signal with its default action. The library
 * installs no signal handlers. A conversion whose file is removed fails
 * when it renames it. */
void bn_convert_remove_temp_files(void);

/* ======================================================================== */
/* JSON output                                                              */
/* ======================================================================== */
/*
 * The streaming JSON writer the library's reports use (receipts,
 * bn_inspect), for programs that write reports beside them: it places
 * commas and indentation and escapes strings; the caller only nests.
 *
 *     bn_json j; bn_json_init(&j, stdout);
 *     bn_json_begin_object(&j);
 *       bn_json_kv_string(&j, "name", "H200");
 *     bn_json_end_object(&j);
 *
 * NaN and infinities are written as null. Nesting deeper than
 * BN_JSON_MAX_DEPTH levels is not supported. One writer is used by one
 * thread at a time.
 */

#define BN_JSON_MAX_DEPTH 32

typedef struct bn_json {
    FILE *out;
    int depth;
    bool has_items[BN_JSON_MAX_DEPTH]; /* does this level already hold a value? */
    bool after_key;                    /* the next value follows a key */
} bn_json;

void bn_json_init(bn_json *j, FILE *out);
void bn_json_begin_object(bn_json *j);
void bn_json_end_object(bn_json *j);
void bn_json_begin_array(bn_json *j);
void bn_json_end_array(bn_json *j);
void bn_json_key(bn_json *j, const char *key);
void bn_json_string(bn_json *j, const char *s);
void bn_json_int(bn_json *j, int64_t v);
void bn_json_uint(bn_json *j, uint64_t v);
void bn_json_double(bn_json *j, double v);
void bn_json_bool(bn_json *j, bool v);
void bn_json_null(bn_json *j);

/* "key": value inside an object. */
void bn_json_kv_string(bn_json *j, const char *key, const char *s);
void bn_json_kv_int(bn_json *j, const char *key, int64_t v);
void bn_json_kv_uint(bn_json *j, const char *key, uint64_t v);
void bn_json_kv_double(bn_json *j, const char *key, double v);
void bn_json_kv_bool(bn_json *j, const char *key, bool v);

#ifdef __cplusplus
}
#endif

#endif /* BITNET_H */
