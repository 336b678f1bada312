#!/usr/bin/env bash
# Builds the Python policy component: guest/python/build.sh OUT.wasm
#
# Installs the pinned toolchain (componentize-py 0.25.1) into guest/python/.toolchain on the
# first run, then componentizes guest/python/policy against wit/0.2 (world policy-component).
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

toolchain="$here/.toolchain"
version="0.25.1"
cpy="$toolchain/bin/componentize-py"

if [ ! -x "$cpy" ] || [ "$("$cpy" --version 2>/dev/null)" != "componentize-py $version" ]; then
    if [ ! -x "$toolchain/bin/python3" ]; then
        python3 -m venv "$toolchain"
    fi
    "$toolchain/bin/pip" install --disable-pip-version-check -q "componentize-py==$version"
fi

# Build from a copy of the sources in a temporary directory: componentize-py generates its
# bindings and writes bytecode caches there, never into the tree.
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/src"
(cd "$here/policy" && tar --exclude=__pycache__ -cf - .) | (cd "$work/src" && tar -xf -)

mkdir -p "$(dirname "$out")"
cd "$work"
"$cpy" -d "$repo/wit/0.2" -w policy-component componentize app \
    -p "$work/src" -o "$out" >/dev/null
