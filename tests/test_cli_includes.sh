#!/usr/bin/env bash
# The bitnet commands are programs on the public API: every source of
# tools/bitnet includes, of the project's headers, only its own (cli.h,
# serve.h) and bitnet.h
# (no header of src/, with quotes or angle brackets). The bench commands
# (cmd_bench.c, bench_*.c, bench.h) measure the library's internal kernels and are
# the exception.
# usage: test_cli_includes.sh SOURCE_DIR
set -u
src=${1:?usage: test_cli_includes.sh SOURCE_DIR}
dir="$src/tools/bitnet"
fails=0
checks=0

# The commands the rule is for must be there, so a rename cannot drop one
# from the check unnoticed.
for f in main.c default_model.c cli.h cmd_run.c cmd_chat.c cmd_perplexity.c cmd_convert.c \
         cmd_devices.c cmd_inspect.c; do
    checks=$((checks + 1))
    [ -f "$dir/$f" ] || { echo "FAIL: tools/bitnet/$f is missing"; fails=$((fails + 1)); }
done

# Names of the library's internal headers.
internal=$(find "$src/src/" -name '*.h' -o -name '*.cuh' | sed 's#.*/##' | sort -u)

for f in "$dir"/*.c "$dir"/*.h; do
    name=${f##*/}
    case "$name" in cmd_bench.c | bench_*.c | bench.h) continue ;; esac
    checks=$((checks + 1))
    while IFS= read -r line; do
        header=$(printf '%s\n' "$line" | sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*["<]\([^">]*\)[">].*/\1/p')
        [ -n "$header" ] || continue
        case "$line" in
        *'"'*) # quoted: the CLI's own headers (cli.h, serve.h) or the public one
            [ "$header" = cli.h ] || [ "$header" = serve.h ] || [ "$header" = bitnet.h ] &&
                continue ;;
        *) # angle brackets: system headers, not the library's
            printf '%s\n' "$internal" | grep -qxF -- "${header##*/}" || continue ;;
        esac
        echo "FAIL: tools/bitnet/$name includes $header: the CLI uses bitnet.h (through cli.h) only"
        fails=$((fails + 1))
    done < <(grep -E '^[[:space:]]*#[[:space:]]*include' "$f")
done

echo "test_cli_includes: $checks checks, $fails failed"
[ "$fails" -eq 0 ]
