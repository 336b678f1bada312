#!/usr/bin/env bash
# Builds this policy into a component: ./build.sh OUT.wasm
#
# The first run installs the pinned toolchain (componentize-py 0.25.1, from PyPI) into
# .toolchain/ next to this script; later runs reuse it. Needs python3 with venv.
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

version="0.25.1"
toolchain="$here/.toolchain"
cpy="$toolchain/bin/componentize-py"
if [ ! -x "$cpy" ] || [ "$("$cpy" --version 2>/dev/null)" != "componentize-py $version" ]; then
    [ -x "$toolchain/bin/python3" ] || python3 -m venv "$toolchain"
    "$toolchain/bin/pip" install --disable-pip-version-check -q "componentize-py==$version"
fi

# componentize-py bundles every Python file on its path: build from a copy of the sources
# (without the toolchain, the WIT, caches or built components), in a temporary directory
# that also receives the generated bindings.
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/src"
(cd "$here" && tar --exclude=./.toolchain --exclude=./wit --exclude=__pycache__ \
    --exclude='*.wasm' --exclude=./.git -cf - .) | (cd "$work/src" && tar -xf -)

mkdir -p "$(dirname "$out")"
cd "$work"
"$cpy" -d "$here/wit" -w policy-component componentize app -p "$work/src" -o "$out" >/dev/null
