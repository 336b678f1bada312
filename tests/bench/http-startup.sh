#!/usr/bin/env bash
# Start-up of `tether serve` with many Streamable HTTP servers (docs/BENCHMARKS.md, "Start-up
# with many HTTP servers"): the gateway's CPU (user + system, from /proc) and the time until
# every server is connected, for each gateway given, alternated run by run. The servers are
# one fixture process on loopback under N names, configured with a URL only, as most are (so
# each may use OAuth); tokens are kept in files under a temporary state directory, as the CLI
# keeps them. Needs release binaries (`mcp-fixture` is taken from beside the first gateway):
#   cargo build --release -p tether-cli -p tether-tests --bin tether --bin mcp-fixture
#   tests/bench/http-startup.sh [-n SERVERS] [-r RUNS] GATEWAY [GATEWAY ...]
set -euo pipefail
servers=100
runs=3
while getopts "n:r:" option; do
    case $option in
        n) servers=$OPTARG ;;
        r) runs=$OPTARG ;;
        *) exit 2 ;;
    esac
done
shift $((OPTIND - 1))
[ $# -ge 1 ] || { echo "usage: $0 [-n SERVERS] [-r RUNS] GATEWAY [GATEWAY ...]" >&2; exit 2; }
work=$(mktemp -d)
fixture_pid=
trap '[ -n "$fixture_pid" ] && kill "$fixture_pid" 2>/dev/null; rm -rf "$work"' EXIT

fixture=$(dirname "$(realpath "$1")")/mcp-fixture
"$fixture" --transport http --bind 127.0.0.1:0 --state-dir "$work/fixture" > "$work/fixture.out" 2> "$work/fixture.err" &
fixture_pid=$!
for _ in $(seq 100); do
    grep -q "listening on" "$work/fixture.out" 2>/dev/null && break
    sleep 0.05
done
addr=$(sed -n 's/^listening on //p' "$work/fixture.out")
python3 - "$servers" "http://$addr/mcp" > "$work/servers.json" <<'PY'
import json, sys
count, url = int(sys.argv[1]), sys.argv[2]
print(json.dumps({"mcpServers": {f"s{i}": {"url": url} for i in range(count)}}))
PY
ticks=$(getconf CLK_TCK)

# One start of gateway $1: its CPU in ms and the ms until `tether status` shows every server
# connected.
measure() {
    local gateway=$1 run=$work/run.$RANDOM
    mkdir -p "$run"
    XDG_STATE_HOME=$run/state "$gateway" serve --config "$work/servers.json" --http 127.0.0.1:0 \
        --state-file "$run/state.json" --log-dir "$run/logs" < /dev/null > "$run/out" 2>&1 &
    local pid=$! start connected=0
    start=$(date +%s%N)
    for _ in $(seq 1200); do
        connected=$("$gateway" status --state-file "$run/state.json" 2>/dev/null |
            grep -ciE "healthy|connected" || true)
        [ "${connected:-0}" -ge "$servers" ] && break
        sleep 0.02
    done
    local ready=$(( ($(date +%s%N) - start) / 1000000 ))
    local cpu
    cpu=$(awk -v t="$ticks" '{print int(($14 + $15) * 1000 / t)}' "/proc/$pid/stat")
    kill "$pid"
    wait "$pid" 2>/dev/null || true
    [ "${connected:-0}" -ge "$servers" ] || { echo "$gateway: only $connected connected" >&2; exit 1; }
    echo "$cpu $ready"
}

echo "| gateway | servers | CPU at start-up | all connected after |"
echo "|---|---|---|---|"
for _ in $(seq "$runs"); do
    for gateway in "$@"; do
        read -r cpu ready < <(measure "$gateway")
        echo "| $gateway | $servers | $cpu ms | $ready ms |"
    done
done
