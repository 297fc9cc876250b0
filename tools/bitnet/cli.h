/* Shared pieces of the bitnet command-line tool: exit codes and the
 * subcommand entry points (one file per subcommand). */
#ifndef BITNET_CLI_H
#define BITNET_CLI_H

#include "bitnet.h"

/* Exit codes, documented in `bitnet --help`. */
enum {
    BN_EXIT_OK = 0,
    BN_EXIT_FAILURE = 1,      /* the command ran and failed              */
    BN_EXIT_USAGE = 2,        /* bad command line                        */
    BN_EXIT_CONFIG = 3,       /* malformed BITNET_* environment variable */
    BN_EXIT_DEVICE = 4,       /* requested device unusable, strict mode  */
    BN_EXIT_INPUT = 5,        /* unreadable or malformed input file      */
    BN_EXIT_OUT_OF_MEMORY = 6 /* host or GPU memory exhausted            */
};

/* Prints "bitnet: error: message" and the hint to stderr and returns the
 * exit code for the error's status. */
int cli_fail(const bn_error *err);

/* Exit code for a status. */
int cli_exit_code(bn_status status);

/* The whole file at path ('-': stdin) in memory, NUL-terminated, its
 * length in *len; what names it in errors ("the prompt file"). A file of
 * more than max_bytes is refused as soon as that many have been read, so
 * /dev/zero or a huge file costs at most max_bytes of memory. NULL after
 * an error set in err: BN_ERR_IO (with the system's reason),
 * BN_ERR_INVALID_ARGUMENT (over the limit: the hint names the option that
 * raises it) or BN_ERR_OUT_OF_MEMORY. */
char *cli_read_all(const char *path, const char *what, size_t max_bytes, size_t *len,
                   bn_error *err);

/* --max-file-mib: the default limit of cli_read_all for the text files of
 * run --prompt-file and perplexity -f, and the largest value accepted. */
#define CLI_MAX_FILE_MIB_DEFAULT 64
#define CLI_MAX_FILE_MIB_MAX 65536
/* "--max-file-mib N": N in MiB, else an error printed (exit code 2). */
bool cli_parse_max_file_mib(const char *cmd, const char *text, size_t *bytes);

/* Option values. Each prints "bitnet CMD: error: ..." itself and returns
 * NULL / false on a missing or malformed value (exit code 2). */
const char *cli_value(int argc, char **argv, int *i, const char *cmd);
bool cli_parse_i64(const char *cmd, const char *opt, const char *text, long long lo, long long hi,
                   long long *out);
bool cli_parse_u64(const char *cmd, const char *opt, const char *text, uint64_t *out);
/* A --device value (auto, cpu, gpu, cuda[:N], vulkan[:N]), else an error printed. */
bool cli_check_device(const char *cmd, const char *text);
/* A --kv value (f32, f16, fp8), else an error printed. */
bool cli_parse_kv(const char *cmd, const char *text, bn_kv_precision *out);
bool cli_parse_float(const char *cmd, const char *opt, const char *text, double lo, double hi,
                     float *out);

/* The options `run` and `chat` share: sampling and the engine. */
typedef struct cli_gen_opts {
    float temperature, top_p, min_p, repeat_penalty;
    int top_k, repeat_last_n;
    uint64_t seed;
    bool have_seed;      /* --seed given */
    const char *device;  /* NULL: BITNET_DEVICE, else auto */
    long long threads, ctx;
    bn_kv_precision kv;        /* --kv */
    long long tensor_parallel; /* --tensor-parallel: GPUs splitting the model */
} cli_gen_opts;

/* run's defaults: temperature 0.8, top-k 40, top-p 0.95, min-p 0.05,
 * repetition penalty off (1.0) over the last 64 tokens. */
void cli_gen_defaults(cli_gen_opts *o);
/* The sampling seed of a run: --seed when given, else BITNET_SEED, else 0
 * under BITNET_DETERMINISTIC=1, else a random one; *fixed says whether it
 * was chosen (not random). */
uint64_t cli_choose_seed(const bn_config *cfg, const cli_gen_opts *o, bool *fixed);
/* When argv[*i] is one of the shared options (--temp, --top-k, --top-p,
 * --min-p, --repeat-penalty, --repeat-last-n, --seed, --device,
 * --threads/-t, --ctx/-c, --kv, --tensor-parallel): parses its value into o, moving *i past
 * it, and returns 1; 0 when it is none of them; -1 after printing an
 * error (exit code 2). */
int cli_gen_option(int argc, char **argv, int *i, const char *cmd, cli_gen_opts *o);
/* The model options o asks for (path = model: NULL means BITNET_MODEL,
 * else the shipped model), starting from bn_model_options_default. */
void cli_gen_model_options(const cli_gen_opts *o, const char *model, bn_model_options *mo);
/* The sampling o asks for, starting from bn_generate_params_default. */
void cli_gen_params(const cli_gen_opts *o, bn_generate_params *gp);

/* The model to use when no -m is given (BITNET_MODEL, else the shipped
 * default model) written to buf; NULL after printing an error naming the
 * places looked at. */
const char *cli_default_model(const bn_config *cfg, char *buf, size_t size, const char *cmd);

/* Subcommands: argv[0] is the subcommand's name. */
int cmd_devices(int argc, char **argv, const bn_config *cfg);
int cmd_bench(int argc, char **argv, const bn_config *cfg);
int cmd_run(int argc, char **argv, const bn_config *cfg);
int cmd_chat(int argc, char **argv, const bn_config *cfg);
int cmd_inspect(int argc, char **argv, const bn_config *cfg);
int cmd_convert(int argc, char **argv, const bn_config *cfg);
int cmd_perplexity(int argc, char **argv, const bn_config *cfg);
int cmd_serve(int argc, char **argv, const bn_config *cfg); /* with libmicrohttpd */

#endif
