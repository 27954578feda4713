#!/usr/bin/env bash
# hack/release-build.sh -- the image test's release build (hack/image.sh
# --build-only), run in the background at the lowest CPU priority, so that
# it takes only the CPU the other steps leave. Whoever starts it first owns
# it: .ci/run starts it before the lint (whose last crates, and the debug
# build's, compile one at a time and leave a core idle), hack/test.sh when
# nobody did; hack/test.sh waits for it before the image test.
#
#   bash hack/release-build.sh start     start it unless it is running
#   bash hack/release-build.sh wait      wait for it; its exit status
#   bash hack/release-build.sh stop      stop it (its process group, by PID)
#
# State under target/: release-build.pid (the build's process group),
# release-build.rc (its exit status, once it ended), release-build.log.
set -euo pipefail
cd "$(dirname "$0")/.."

pid_file=target/release-build.pid
rc_file=target/release-build.rc
log_file=target/release-build.log

log() { printf '[release-build] %s\n' "$*" >&2; }

# The recorded PID, if that process is still the build this script started
# (a PID reused by another process since is not ours: its command line says).
live_pid() {
    local pid
    pid=$(cat "$pid_file" 2>/dev/null) || return 1
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q 'hack/image.sh --build-only' || return 1
    printf '%s\n' "$pid"
}

start() {
    if live_pid >/dev/null; then
        log "already running (log: $log_file)"
        return 0
    fi
    mkdir -p target
    rm -f "$rc_file" "$pid_file"
    # Its own session (setsid), so stop ends cargo and every rustc under it;
    # the session leader writes its PID (setsid may fork: $! would not be
    # it) and, once the build ended, its exit status. A new session is a new
    # scheduler autogroup where the kernel groups by session
    # (sched_autogroup_enabled), and nice works only inside a group: the
    # group shares the CPU equally with the caller's, so the build took a
    # whole core from the lint and the tests. The group's own nice (its
    # /proc autogroup file) gives it only what they leave.
    setsid nice -n 19 bash -c '{ echo 19 >/proc/self/autogroup; } 2>/dev/null; echo $$ >'"$pid_file"'; bash hack/image.sh --build-only; echo $? >'"$rc_file" \
        >"$log_file" 2>&1 </dev/null &
    local waited=0
    until [ -s "$pid_file" ] || [ -s "$rc_file" ]; do
        sleep 0.1
        waited=$((waited + 1))
        [ "$waited" -lt 300 ] || { log "the build did not start within 30 s ($log_file)"; return 1; }
    done
    log "started at nice 19 (log: $log_file)"
}

wait_for_it() {
    local pid
    while pid=$(live_pid); do
        sleep 1
    done
    if [ ! -s "$rc_file" ]; then
        log "the release build is not running and left no exit status: was it started (bash hack/release-build.sh start)?"
        return 1
    fi
    local rc
    rc=$(cat "$rc_file")
    if [ "$rc" != 0 ]; then
        tail -n 40 "$log_file" >&2
        log "the release build failed with status $rc ($log_file)"
        return 1
    fi
    grep -h 'Finished' "$log_file" >&2 || true
}

stop() {
    local pid
    if pid=$(live_pid); then
        kill -- -"$pid" 2>/dev/null || kill "$pid" 2>/dev/null || true
        while kill -0 "$pid" 2>/dev/null; do sleep 0.2; done
        log "stopped"
    fi
    rm -f "$pid_file"
}

case "${1:-}" in
    start) start ;;
    wait) wait_for_it ;;
    stop) stop ;;
    *) sed -n '2,14p' "$0" >&2; exit 2 ;;
esac
