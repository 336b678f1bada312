#!/usr/bin/env bash
# System calls a forwarded call costs `tether serve` on stdio, against socat's, and the share of
# Tether's CPU spent in user space (docs/BENCHMARKS.md, "Where a stdio call's added time at one
# client goes"). Needs Debian's strace, socat, procps (pgrep) and python3, and release binaries:
#   cargo build --release -p tether-tests --bin tether-cli --bin tether-bench --bin mcp-fixture
#   tests/bench/stdio-syscalls.sh [RELEASE_DIR] [CALLS]
set -euo pipefail
release=$(realpath "${1:-${CARGO_TARGET_DIR:-target}/release}")
calls=${2:-2000}
# Resolved: the benchmark finds the gateway beside itself by its resolved path.
work=$(realpath "$(mktemp -d)")
trap 'rm -rf "$work"' EXIT
# The benchmark runs the `tether-cli` beside it: copies, so that a wrapper can stand in for it.
cp "$release"/{tether-bench,mcp-fixture} "$work"/
cp "$release"/tether-cli "$work"/tether-cli.real
printf '#!/bin/sh\nexec strace -f -qq -e signal=none -o %s/tether.trace %s/tether-cli.real "$@"\n' \
    "$work" "$work" > "$work"/tether-cli
printf '#!/bin/sh\nexec strace -f -qq -e signal=none -o %s/socat.$$.trace socat "$@"\n' "$work" \
    > "$work"/socat
chmod +x "$work"/tether-cli "$work"/socat
bench() {
    "$work"/tether-bench forwarding --transports stdio --sizes 100 --concurrency 1 --rounds 1 \
        --min-calls "$calls" --max-calls "$calls" "$@"
}
# Traced: the timings of this run are strace's, not the paths'.
bench --socat "$work"/socat > /dev/null

# Counts the system calls of the traced program's own threads, not those of the server it
# started (a process that ran execve, and the threads that process made). Divided by the calls
# measured; start-up and the benchmark's few warm-up calls are counted too (under 1 %).
count() {
    python3 - "$1" "$calls" <<'PY'
import collections, re, sys
lines = open(sys.argv[1]).read().splitlines()
calls = int(sys.argv[2])
root = lines[0].split()[0]
execs = {l.split()[0] for l in lines if "execve(" in l and l.split()[0] != root}
parent = {}
for l in lines:
    m = re.match(r"(\d+)\s+.*clone3?.*?(?:parent_tid=\[(\d+)\]|\) = (\d+))", l)
    if m and (m.group(2) or m.group(3)):
        parent[m.group(2) or m.group(3)] = m.group(1)
def foreign(pid):
    while pid:
        if pid in execs:
            return True
        pid = parent.get(pid)
    return False
counts, threads = collections.Counter(), collections.Counter()
for l in lines:
    pid, _, rest = l.partition(" ")
    rest = rest.strip()
    if not pid.isdigit() or foreign(pid) or rest.startswith(("<...", "---", "+++")):
        continue
    counts[rest.split("(")[0]] += 1
    threads[pid] += 1
total = sum(counts.values())
busiest = threads.most_common(1)[0][1]
print(f"  {total / calls:.1f} system calls a call:",
      ", ".join(f"{name} {n / calls:.2f}" for name, n in counts.most_common(5)))
print(f"  futex {counts['futex']} in all; {len(threads)} threads, the busiest made "
      f"{100 * busiest / total:.0f} % of the system calls")
PY
}
echo "tether serve:"; count "$work"/tether.trace
# The benchmark may start socat more than once (a check that it is there, then the relay): the
# largest trace is the relay's.
echo "socat:"; count "$(ls -S "$work"/socat.*.trace | head -1)"

# Untraced: the paths' timings, and the user and system CPU of `tether serve` from its /proc
# stat, read while it runs.
cp "$work"/tether-cli.real "$work"/tether-cli
bench > "$work"/untraced &
running=$!
while kill -0 "$running" 2>/dev/null; do
    for pid in $(pgrep -f "$work/tether-cli serve" || true); do
        cat "/proc/$pid/stat" > "$work/stat.$pid" 2>/dev/null || true
    done
    sleep 0.05
done
wait "$running"
grep -E '^\| 100 B +\| 1 +\| (relay|tether)' "$work"/untraced || echo "(no rows: see the benchmark's output format)"
stats=("$work"/stat.*)
if [ ! -e "${stats[0]}" ]; then
    echo "tether serve was not seen running" >&2
    exit 1
fi
# The gateway that served the calls: the one that spent the most.
cat "${stats[@]}" | sort -k14,14n | tail -1 |
    awk '{ total = $14 + $15; if (total == 0) { print "tether serve: no CPU recorded"; exit }
           printf "tether serve: %.0f %% of its CPU in user space (%d user, %d system ticks)\n",
                  100 * $14 / total, $14, $15 }'
