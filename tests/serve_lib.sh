# Starting and stopping `bitnet serve` in the server's tests (sourced):
#   serve_require BITNET                        exits 77 when bitnet was built
#                                              without the server
#   serve_start BITNET ERRFILE [serve options]  sets pid, port and url;
#                                              fails (1) if it is not ready
#                                              within 30 s
#   serve_one BITNET [serve options]            for a test of one server: sets
#                                              tmp (removed at exit, when the
#                                              server is killed), clears the
#                                              environment the server reads,
#                                              starts it with 2 threads; exits
#                                              1 if it does not start
#   serve_stop SIGNAL                           signals pid and waits for it
#                                              (at most 20 s); sets rc
serve_require() {
    "$1" --help 2>&1 | grep -q '^  serve ' || { echo "SKIP: bitnet was built without serve"; exit 77; }
}

serve_start() {
    local bitnet=$1 err=$2
    shift 2
    "$bitnet" serve --port 0 "$@" 2>"$err" &
    pid=$!
    for _ in $(seq 1 300); do
        grep -q 'bitnet serve: ready' "$err" 2>/dev/null && break
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    port=$(sed -n 's#.*listening on http://127.0.0.1:\([0-9]*\).*#\1#p' "$err")
    url="http://127.0.0.1:$port"
    grep -q 'bitnet serve: ready' "$err"
}

serve_stop() {
    kill -"$1" "$pid"
    rc=124
    for _ in $(seq 1 200); do
        if ! kill -0 "$pid" 2>/dev/null; then
            wait "$pid"
            rc=$?
            return
        fi
        sleep 0.1
    done
}

serve_one() {
    local bitnet=$1
    shift
    tmp=$(mktemp -d)
    unset BITNET_API_KEY BITNET_DEVICE
    export BITNET_NUM_THREADS=2
    pid=
    trap 'kill -9 $pid 2>/dev/null; rm -rf "$tmp"' EXIT
    serve_start "$bitnet" "$tmp/err" "$@" ||
        { echo "FAIL: the server did not start"; cat "$tmp/err"; exit 1; }
}
