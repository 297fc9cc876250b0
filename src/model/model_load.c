/* model_load.c - bn_checkpoint_load: a directory is a Hugging Face checkpoint,
 * anything else is read as GGUF. Kept apart from model.c so that programs
 * using only random models do not pull in the file readers. */
#include <sys/stat.h>

#include "model.h"

bn_status bn_checkpoint_load(const char *path, bn_checkpoint **out, bn_error *err)
{
    struct stat sb;
    if (!path || stat(path, &sb) != 0)
        return bn_error_set(err, BN_ERR_IO, "check the path",
                            "cannot open model %s", path ? path : "(null)");
    if (S_ISDIR(sb.st_mode))
        return bn_checkpoint_load_hf_dir(path, out, err);
    return bn_checkpoint_load_gguf(path, out, err);
}
