#!/usr/bin/env bash
# The client packages built as their registries ship them:
#
#   scripts/build-artifacts.sh LANG [OUTDIR]     one language's artifacts into OUTDIR (made
#                                                empty first; default target/artifacts/LANG)
#   scripts/build-artifacts.sh --list            the languages it knows
#
#   node     the tarball npm would publish from clients/node (`npm pack`: the package.json
#            `files`, no install needed), pg-idempotency-VERSION.tgz
#
# A language is a function build_LANG OUTDIR below, listed in LANGS. The paths of what was
# built are printed last, one a line (the build's own output goes to stderr).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
LANGS="node"

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
die() { echo "build-artifacts.sh: $*" >&2; exit 2; }

build_node() { # build_node OUTDIR
    local out=$1
    (cd "$ROOT/clients/node" && npm pack --pack-destination "$out" --loglevel=warn >&2)
    ls "$out"/*.tgz
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
