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

out="$1"
case "$out" in
    /*) ;;
    *) out="$PWD/$out" ;;
esac
target="wasm32-wasip2"

# Work in this directory (where cargo finds Cargo.toml, and rustup any rust-toolchain.toml).
case "${BASH_SOURCE[0]}" in
    */*) cd -- "${BASH_SOURCE[0]%/*}/" ;;
esac
if command -v rustup >/dev/null 2>&1 && ! rustup target list --installed | grep -qx "$target"; then
    rustup target add "$target"
fi

# Decodes a JSON string's contents (without its quotes) into $decoded. Cargo (serde_json) escapes
# only `"`, `\` and control characters; those come as \n, \t... or \u00XX.
json_unescape() {
    local s="$1" c
    decoded=""
    while [[ $s == *\\* ]]; do
        decoded+="${s%%\\*}"
        s="${s#*\\}"
        case "${s:0:1}" in
            n) c=$'\n' ;;
            t) c=$'\t' ;;
            r) c=$'\r' ;;
            b) c=$'\b' ;;
            f) c=$'\f' ;;
            u) printf -v c '%b' "\\x${s:3:2}"; s="${s:4}" ;;
            *) c="${s:0:1}" ;; # \" \\ \/
        esac
        decoded+="$c"
        s="${s:1}"
    done
    decoded+="$s"
}

# Sets $wasm to the .wasm among the "filenames" of one cargo message (a JSON object on one line).
# It reads the line token by token, so a path holding quotes, backslashes or `"filenames"` itself
# cannot fool it.
wasm_in() {
    local rest="$1" string='^"(([^"\\]|\\.)*)"' other='^[^"]+' key="" in_filenames=0 token
    while [ -n "$rest" ]; do
        if [[ $rest =~ $string ]]; then
            token="${BASH_REMATCH[1]}"
            rest="${rest:${#BASH_REMATCH[0]}}"
            if [ "$in_filenames" = 1 ] && [[ $token == *.wasm ]]; then
                json_unescape "$token"
                wasm="$decoded"
                return 0
            fi
            key="$token"
        elif [[ $rest =~ $other ]]; then
            token="${BASH_REMATCH[0]}"
            rest="${rest:${#token}}"
            [ "$key" = filenames ] && [[ $token == :\[* ]] && in_filenames=1
            [[ $token == *\]* ]] && in_filenames=0
            key=""
        else
            return 1 # an unterminated string: not a message
        fi
    done
    return 1
}

# --locked: build with the versions in Cargo.lock (run `cargo update` to change them on purpose).
# Cargo's JSON messages name the built .wasm wherever the target directory is.
json=--message-format=json-render-diagnostics
messages="$(cargo build --locked --release --target "$target" "$json")"
wasm=""
while IFS= read -r line; do
    case "$line" in
        '{"reason":"compiler-artifact"'*'.wasm"'*) wasm_in "$line" || true ;;
    esac
done <<<"$messages"
if [ -z "$wasm" ] || [ ! -f "$wasm" ]; then
    echo "error: cargo built no .wasm (is crate-type [\"cdylib\"] still in Cargo.toml?)" >&2
    exit 1
fi
# A component starts with \0asm and version 0d 00 01 00 (a core module: 01 00 00 00).
if [ "$(head -c 8 -- "$wasm" | od -An -tx1 | tr -d ' \n')" != "0061736d0d000100" ]; then
    echo "error: $wasm is a core module, not a component (build for $target)" >&2
    exit 1
fi

mkdir -p -- "${out%/*}/"
cp -- "$wasm" "$out"
echo "built $out ($(wc -c <"$out") bytes)" >&2
