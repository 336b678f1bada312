#!/usr/bin/env bash
# Builds this policy into a WebAssembly component: ./build.sh OUT.wasm
#
# Installs the pinned toolchain (package-lock.json) into node_modules/ beside this script when
# it is missing or older than the lock, then builds policy.js against wit/policy.wit.
# Both `--disable` flags are needed: without them the component imports wasi:http, which
# Tether's sandbox does not provide, and the host refuses it.
set -euo pipefail

if [ "$#" -ne 1 ]; then
  echo "usage: $0 OUT.wasm" >&2
  exit 2
fi

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="$1"
case "$out" in
  /*) ;;
  *) out="$PWD/$out" ;;
esac

if [ ! -x "$here/node_modules/.bin/componentize-js" ] \
  || [ ! -f "$here/node_modules/.package-lock.json" ] \
  || [ "$here/package-lock.json" -nt "$here/node_modules/.package-lock.json" ]; then
  if ! (cd "$here" && npm ci --no-audit --no-fund --silent); then
    echo "error: installing the pinned toolchain failed (npm ci in $here); run it there to see why" >&2
    exit 1
  fi
fi

mkdir -p "$(dirname "$out")"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
if ! (cd "$here" && node_modules/.bin/componentize-js \
  --wit wit \
  --world-name policy-component \
  --disable http --disable fetch-event \
  -o "$out" policy.js) >"$log" 2>&1; then
  cat "$log" >&2
  exit 1
fi
