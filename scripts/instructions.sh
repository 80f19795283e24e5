#!/usr/bin/env bash
# Instructions per delivered message: courier against (g), the minimal durable forwarder,
# counted by valgrind's callgrind over a closed-loop window (wrk, 8 connections, 1 KiB JSON).
#
#   ./scripts/instructions.sh [COURIER_BINARY] [SECONDS]
#
# Why: CPU time per message moves ±5% between runs on a shared 2-core machine, so a change
# worth 3% cannot be seen in time; the instruction count of the same binary and load repeats
# within 1% (docs/benchmarks.md, "Issue 43, step 4"). It counts user space only (the kernel's
# share is in the probe's time figures) and counts a `rep movsb`/`rep stosb` byte by byte, so
# read memcpy/memset lines as bytes moved, not as time.
#
# The window starts after a warm-up whose deliveries have ended and ends once the window's
# have (both drained), so every 202 of the window is delivered inside it and instructions /
# 202s is instructions per delivered message. Needs valgrind, wrk and curl (Debian packages);
# builds the release binary and loadgen (for (g) and its bare receiver) when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-target}"
courier="${1:-$target/release/courier}"
window="${2:-10}"
for tool in valgrind wrk curl callgrind_annotate; do
    command -v "$tool" >/dev/null || { echo "instructions: $tool is not installed (apt-get install valgrind wrk curl)" >&2; exit 2; }
done
[ -x "$courier" ] || cargo build --release --locked --bin courier
loadgen="$target/release/examples/loadgen"
[ -x "$loadgen" ] || cargo build --release --locked --example loadgen

work="$(mktemp -d)"
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
cat > "$work/post.lua" <<'LUA'
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"type":"order.created","data":"' .. string.rep("x", 990) .. '"}'
LUA

# A child that prints its address on its first line (loadgen's servers).
first_line() { for _ in $(seq 1 600); do [ -s "$1" ] && { head -1 "$1"; return; }; sleep 0.1; done; echo "no address in $1" >&2; exit 1; }

"$loadgen" --serve-baseline > "$work/rx.addr" & pids+=($!)
receiver="$(first_line "$work/rx.addr")"

# Waits until PID has drained: its CPU time grows by under 5 ticks in half a second (what is
# left is timers; a delivery under valgrind costs more). At most two minutes.
wait_idle() {
    local cpu last=-100
    for _ in $(seq 1 240); do
        cpu=$(awk '{print $14 + $15}' "/proc/$1/stat")
        [ $((cpu - last)) -lt 5 ] && return
        last=$cpu
        sleep 0.5
    done
    echo "instructions: pid $1 never went idle" >&2; exit 1
}

# measure NAME URL PID OUT: the window's instructions / its 202s.
measure() {
    local name=$1 url=$2 pid=$3 out=$4
    wrk -t1 -c8 -d3s -s "$work/post.lua" "$url" >/dev/null
    wait_idle "$pid"
    callgrind_control -d "$pid" >/dev/null 2>&1
    local acks
    acks=$(wrk -t1 -c8 -d"${window}s" -s "$work/post.lua" "$url" | awk '/requests in/ {print $1}')
    wait_idle "$pid"
    callgrind_control -d "$pid" >/dev/null 2>&1
    [ -s "$out.$pid.2" ] || { echo "instructions: no profile of the window from pid $pid" >&2; exit 1; }
    local ir
    ir=$(callgrind_annotate "$out.$pid.2" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')
    per=$((ir / acks))
    printf '%-8s %8d 202s  %12d instructions  %8d per delivered message\n' "$name" "$acks" "$ir" "$per"
}

callgrind=(valgrind --tool=callgrind --separate-threads=no)
port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
ingress=$(port); admin=$(port)
cat > "$work/courier.toml" <<TOML
listen = "127.0.0.1:$ingress"
admin_listen = "127.0.0.1:$admin"
data_dir = "$work/courier-data"
[egress]
allow = ["127.0.0.1/32"]
[delivery]
max_in_flight_per_host = 64
rate_per_second = 1000000
TOML
"${callgrind[@]}" --callgrind-out-file="$work/courier.%p" "$courier" serve --config "$work/courier.toml" >/dev/null 2>"$work/courier.log" & pids+=($!)
cpid=$!
for _ in $(seq 1 600); do curl -fs "http://127.0.0.1:$admin/readyz" >/dev/null && break; sleep 0.1; done
measure courier "http://127.0.0.1:$ingress/http://$receiver/hook" "$cpid" "$work/courier"

"${callgrind[@]}" --callgrind-out-file="$work/g.%p" "$loadgen" --serve-floor-baseline "$receiver" "$work/g-data" > "$work/g.addr" 2>"$work/g.log" & pids+=($!)
gpid=$!
courier_per=$per
measure "(g)" "http://$(first_line "$work/g.addr")/http://$receiver/hook" "$gpid" "$work/g"
awk -v c="$courier_per" -v g="$per" 'BEGIN { printf "courier/(g): %.2fx the instructions per delivered message\n", c / g }'
# KEEP=DIR keeps the windows' profiles: `callgrind_annotate --threshold=100 DIR/courier.*.2`.
if [ -n "${KEEP:-}" ]; then mkdir -p "$KEEP" && cp "$work"/courier.*.2 "$work"/g.*.2 "$KEEP"/; fi
