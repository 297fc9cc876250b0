#!/usr/bin/env bash
# bitnet serve under load (tests/test_serve_load.py): 2,000 requests from
# 64 clients at once, malformed requests and streams the client leaves
# mixed in; then SIGTERM must stop the server with exit 0. Skipped (77)
# without the server.
# usage: test_serve_load.sh /path/to/bitnet
set -u
BITNET=${1:?usage: test_serve_load.sh BITNET}
here=$(cd "$(dirname "$0")" && pwd)
. "$here/serve_lib.sh"
serve_require "$BITNET"
serve_one "$BITNET" --parallel 16 --max-queue 128
# Under AddressSanitizer freed memory waits in its quarantine, so the
# resident size says nothing about leaks there (LeakSanitizer checks them
# at exit instead).
rss=check
grep -q __asan_init "$BITNET" && rss=skip
python3 "$here/test_serve_load.py" "http://127.0.0.1:$port" "$pid" "$rss"
rc=$?
status=$rc
serve_stop TERM
[ "$rc" = 0 ] || { echo "FAIL: SIGTERM: exit code $rc"; tail -20 "$tmp/err"; status=1; }
rc=$status
echo "server log: $(grep -c ' tokens ' "$tmp/err") request lines, $(grep -c 'connection ended early' "$tmp/err") ended early"
exit $rc
