#!/usr/bin/env bash
# The client packages built as their registries ship them:
#
#   scripts/build-artifacts.sh LANG [OUTDIR]     one language's artifacts into OUTDIR (made
#                                                empty first; default target/artifacts/LANG)
#   scripts/build-artifacts.sh --list            the languages it knows
#
#   python   the wheel and the sdist of clients/python (`python -m build`, with its isolated
#            build environment; `build` is installed into a throwaway venv when the Python at
#            hand lacks it). Versions pinned by clients/python/constraints.txt (PIP_CONSTRAINT).
#   rust     the .crate of clients/rust (`cargo package --locked`: the files crates.io would get,
#            unpacked and built on their own first); uncommitted changes are packed as they are
#            (--allow-dirty). Build output in CARGO_TARGET_DIR (default target/clients).
#
# A language is a function build_LANG OUTDIR below, listed in LANGS. The paths of what was
# built are printed last, one a line (the build's own output goes to stderr).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
LANGS="python rust"

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
die() { echo "build-artifacts.sh: $*" >&2; exit 2; }

build_python() { # build_python OUTDIR
    local out=$1 py=${PYTHON:-python3} scratch=""
    export PIP_CONSTRAINT=$ROOT/clients/python/constraints.txt PIP_DISABLE_PIP_VERSION_CHECK=1
    if ! "$py" -c 'import build' 2>/dev/null; then
        scratch=$(mktemp -d)
        "$py" -m venv "$scratch/venv"
        "$scratch/venv/bin/pip" install -q build >&2
        py=$scratch/venv/bin/python
    fi
    "$py" -m build --outdir "$out" "$ROOT/clients/python" >&2
    [ -z "$scratch" ] || rm -rf "$scratch"
    ls "$out"/*.whl "$out"/*.tar.gz
}

build_rust() { # build_rust OUTDIR
    local out=$1 target=${CARGO_TARGET_DIR:-$ROOT/target/clients}
    rm -f "$target"/package/pg-idempotency-*.crate
    PATH="$HOME/.cargo/bin:$PATH" cargo package --locked --allow-dirty \
        --manifest-path "$ROOT/clients/rust/Cargo.toml" --target-dir "$target" >&2
    cp "$target"/package/pg-idempotency-*.crate "$out"/
    ls "$out"/*.crate
}

case ${1:-} in
    -h|--help) usage; exit 0 ;;
    --list) tr ' ' '\n' <<<"$LANGS"; exit 0 ;;
    "") usage >&2; exit 2 ;;
esac
lang=$1
[[ " $LANGS " == *" $lang "* ]] || die "unknown language '$lang' (known: $LANGS)"
out=$(realpath -m "${2:-$ROOT/target/artifacts/$lang}")
rm -rf "$out"
mkdir -p "$out"
"build_$lang" "$out"
