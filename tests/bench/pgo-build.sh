#!/usr/bin/env bash
# A profile-guided build of the gateway (docs/BENCHMARKS.md, section 8, "A profile-guided
# build"): `tether` built instrumented, trained on the benchmarks' forwarding workloads (stdio and
# Streamable HTTP, 100 B and 100 KB results, 1 and 16 clients, both protocol generations), then
# built again with what the training counted. Needs rustup's llvm-tools (added when missing),
# Debian's socat and procps; two cold builds of the gateway, about 35 minutes on two cores.
#   tests/bench/pgo-build.sh
# Prints the binary's path: ${CARGO_TARGET_DIR:-target}/pgo/release/tether. A target directory
# of its own, since every crate is compiled with other flags. The `release` profile: a
# profile-guided `dist` build (whole-program optimisation too) has not been measured.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
# Absolute (a relative CARGO_TARGET_DIR is taken from where the script was started), and
# exported, so that cargo, run from the repository, uses the same one.
target=$(realpath -m "${CARGO_TARGET_DIR:-$repo/target}")
export CARGO_TARGET_DIR=$target
cd "$repo"
profile=release
pgo=$target/pgo
data=$pgo/profile-data
if [ -n "${RUSTFLAGS:-}${CARGO_ENCODED_RUSTFLAGS:-}" ]; then
    echo "RUSTFLAGS is set: cargo would ignore the per-target flags this build needs" >&2
    exit 1
fi
host=$(rustc -vV | sed -n 's/^host: //p')
# Flags for the host target only: they reach the gateway and every crate it links, not the wasm
# policy that host/build.rs builds with a cargo of its own.
flags=CARGO_TARGET_$(echo "$host" | tr 'a-z-' 'A-Z_')_RUSTFLAGS
profdata=$(rustc --print sysroot)/lib/rustlib/$host/bin/llvm-profdata
[ -x "$profdata" ] || rustup component add llvm-tools

# The benchmark and the fixture that drive the training, built as usual.
cargo build --release -p tether-tests --bin tether-bench --bin mcp-fixture
env "$flags=-Cprofile-generate=$data" \
    cargo build --profile "$profile" --target-dir "$pgo" -p tether-cli --bin tether
# Build scripts and proc-macros compiled with the flag wrote profiles of their own runs.
rm -rf "$data"

train=$pgo/train
rm -rf "$train" && mkdir -p "$train"
cp "$target/release/tether-bench" "$target/release/mcp-fixture" "$train/"
cp "$pgo/$profile/tether" "$train/tether-real"
# The benchmarks find `tether-cli` beside themselves and end it with SIGKILL, which would lose
# its profile: this shell takes the kill, and the gateway gets SIGTERM and writes the profile.
cat > "$train/tether-cli" <<'WRAPPER'
#!/bin/sh
exec 3<&0
"$(dirname "$0")/tether-real" "$@" <&3 3<&- &
child=$!
shell=$$
(
    while kill -0 $shell 2>/dev/null && ! grep -q '^State:.Z' /proc/$shell/status 2>/dev/null; do
        sleep 0.1
    done
    # Still the gateway (not a process that took its id after a normal exit)?
    grep -q tether-real /proc/$child/cmdline 2>/dev/null && kill -TERM $child
) </dev/null >/dev/null 2>&1 &
wait $child
WRAPPER
chmod +x "$train/tether-cli"
"$train/tether-bench" forwarding --transports stdio,http --sizes 100,102400 --concurrency 1,16 \
    --rounds 1 --max-calls 1000 > "$train/forwarding.txt"
# The 2026-07-28 generation's calls (the forwarding benchmark's client speaks 2025-11-25).
"$train/tether-bench" gateway --rounds 1 --calls 2000 --concurrency 1,16 > "$train/gateway.txt"
# The gateways write their profiles as they exit, shortly after the benchmarks end theirs.
for _ in $(seq 300); do
    pgrep -f "$train/tether-real" > /dev/null || break
    sleep 0.1
done
if pgrep -f "$train/tether-real" > /dev/null; then
    echo "gateways still running 30 s after the training: $(pgrep -f "$train/tether-real" | xargs)" >&2
    exit 1
fi
ls "$data"/*.profraw > /dev/null || { echo "the training wrote no profile into $data" >&2; exit 1; }
"$profdata" merge -o "$pgo/merged.profdata" "$data"

env "$flags=-Cprofile-use=$pgo/merged.profdata" \
    cargo build --profile "$profile" --target-dir "$pgo" -p tether-cli --bin tether
echo "$pgo/$profile/tether"
