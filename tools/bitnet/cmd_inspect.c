/* bitnet inspect FILE|DIR [--json]: what a model file holds, whether or not
 * bitnet can run it (bn_inspect writes the report). */
#include <stdio.h>
#include <string.h>

#include "cli.h"

static void usage(FILE *out)
{
    fprintf(out,
            "usage: bitnet inspect FILE|DIR [--json]\n"
            "\n"
            "Shows what a model holds: for a GGUF file the header, every metadata key/value (long\n"
            "arrays summarised, e.g. \"[128256 strings]\"), and the tensor table (name, shape,\n"
            "type, bytes, offset); for a Hugging Face directory its config.json and tensors; for\n"
            "a .safetensors file its tensors. Then whether bitnet can run it: the detected\n"
            "flavour and hyper-parameters, or why not. Works on any GGUF, runnable or not.\n"
            "\n"
            "  --json    print the same as one JSON object\n"
            "  --help    show this help\n");
}

int cmd_inspect(int argc, char **argv, const bn_config *cfg)
{
    (void)cfg;
    bn_inspect_options opt = {.json = false};
    const char *path = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0) {
            opt.json = true;
        } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return BN_EXIT_OK;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            fprintf(stderr, "bitnet inspect: error: unknown option '%s'\n", argv[i]);
            usage(stderr);
            return BN_EXIT_USAGE;
        } else if (path) {
            fprintf(stderr, "bitnet inspect: error: one path at a time ('%s' and '%s')\n", path,
                    argv[i]);
            return BN_EXIT_USAGE;
        } else {
            path = argv[i];
        }
    }
    if (!path) {
        fprintf(stderr, "bitnet inspect: error: no file or directory given\n");
        usage(stderr);
        return BN_EXIT_USAGE;
    }
    bn_error err;
    bn_error_clear(&err);
    if (bn_inspect(path, &opt, stdout, &err) != BN_OK)
        return cli_fail(&err);
    return BN_EXIT_OK;
}
