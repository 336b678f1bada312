#!/usr/bin/env bash
# Builds this policy into a component: ./build.sh OUT.wasm
#
# Needs Rust (cargo, 1.85 or newer) with the wasm32-wasip2 target; with rustup, the target is
# added when missing. That target links a WebAssembly component directly: no other tool needed.
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
target="wasm32-wasip2"

cd "$here"
# (In this directory rustup picks the toolchain cargo will use, rust-toolchain.toml included.)
if command -v rustup >/dev/null 2>&1 && ! rustup target list --installed | grep -qx "$target"; then
    rustup target add "$target"
fi

# Cargo's JSON messages name the built .wasm wherever the target directory is.
messages="$(cargo build --release --target "$target" --message-format=json-render-diagnostics)"
wasm="$(printf '%s\n' "$messages" | grep -o '"filenames":\["[^"]*\.wasm"' | tail -n 1 | sed 's/.*\["//; s/"$//' || true)"
if [ -z "$wasm" ] || [ ! -f "$wasm" ]; then
    echo "error: cargo built no .wasm (is crate-type [\"cdylib\"] still in Cargo.toml?)" >&2
    exit 1
fi
# A component starts with \0asm and version 0d 00 01 00 (a core module: 01 00 00 00).
if [ "$(head -c 8 "$wasm" | od -An -tx1 | tr -d ' \n')" != "0061736d0d000100" ]; then
    echo "error: $wasm is a core module, not a component (build for $target)" >&2
    exit 1
fi

mkdir -p "$(dirname "$out")"
cp "$wasm" "$out"
echo "built $out ($(wc -c <"$out") bytes)" >&2
