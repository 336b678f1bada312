#!/usr/bin/env bash
# Builds the JavaScript policy component: guest/js/build.sh OUT.wasm
#
# Installs the pinned toolchain (package-lock.json) into guest/js/node_modules when it is
# missing or older than the lock, then builds src/policy.js against wit/0.2 of this repository.
# `--disable http --disable fetch-event`: without both, componentize-js components import
# wasi:http, which Tether's sandbox does not link (the component would be refused).
set -euo pipefail

if [ "$#" -ne 1 ]; then
  echo "usage: $0 OUT.wasm" >&2
  exit 2
fi

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="$1"
case "$out" in
  /*) ;;
  *) out="$PWD/$out" ;;
esac

# node_modules/.package-lock.json is written by npm on every install: older than the lock
# (or missing) means the installed tree may not be the pinned one.
if [ ! -x "$here/node_modules/.bin/componentize-js" ] \
  || [ ! -f "$here/node_modules/.package-lock.json" ] \
  || [ "$here/package-lock.json" -nt "$here/node_modules/.package-lock.json" ]; then
  if ! (cd "$here" && npm ci --no-audit --no-fund --silent); then
    echo "error: installing the pinned toolchain failed (npm ci in $here); run it there to see why" >&2
    exit 1
  fi
fi

mkdir -p "$(dirname "$out")"
# componentize-js prints nothing useful on success; keep its output only when it fails.
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
if ! (cd "$here" && node_modules/.bin/componentize-js \
  --wit "$repo/wit/0.2" \
  --world-name policy-component \
  --disable http --disable fetch-event \
  -o "$out" src/policy.js) >"$log" 2>&1; then
  cat "$log" >&2
  exit 1
fi
