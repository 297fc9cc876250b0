#!/usr/bin/env bash
# The chat page of bitnet serve in headless chromium
# (tests/test_serve_page.py, selenium from the virtual environment
# scripts/install-deps.sh makes). Skipped (77) without the server,
# chromium and its driver, or selenium.
# usage: test_serve_page.sh /path/to/bitnet
set -u
BITNET=${1:?usage: test_serve_page.sh BITNET}
here=$(cd "$(dirname "$0")" && pwd)
venv=${BITNET_TEST_VENV:-$HOME/.cache/bitnet/test-venv}
. "$here/serve_lib.sh"
serve_require "$BITNET"
[ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ] ||
    { echo "SKIP: chromium and chromium-driver are not installed (scripts/install-deps.sh)"; exit 77; }
"$venv/bin/python" -c 'import selenium' 2>/dev/null ||
    { echo "SKIP: no selenium in $venv (scripts/install-deps.sh makes it)"; exit 77; }
serve_one "$BITNET" --parallel 2
HOME="$tmp" timeout 240 "$venv/bin/python" "$here/test_serve_page.py" "http://127.0.0.1:$port"
rc=$?
status=$rc
serve_stop TERM
[ "$rc" = 0 ] || { echo "FAIL: SIGTERM: the server's exit code was $rc"; status=1; }
exit $status
