#!/usr/bin/env bash
# The lint gates CI runs (the suite `lint`), one counted check each:
#   rust     `cargo fmt --check` and `cargo clippy --all-targets -- -D warnings` for each crate
#            in CRATES; the extension as the unit tests build it and as the in-process tests
#            build it (feature pg_test)
#   shell    shellcheck (Debian's; scripts/install-deps.sh) over every shell script in
#            scripts/, tests/, bench/, packaging/, clients/ and .ci/, with .shellcheckrc
#   python   ruff check (RUFF_VERSION from PyPI, in the venv target/lint-venv made here) over
#            every Python file, with ruff.toml
#   js       eslint (clients/node's devDependency; npm ci there when it is missing) over
#            clients/node and examples/clients/node, with clients/node/eslint.config.js
#   hygiene  scripts/check-test-hygiene.sh: no /proc/sys, no port outside tests/lib.sh's table
#   scripts/lint.sh              all of them
#   scripts/lint.sh GROUP...     some, e.g. scripts/lint.sh shell python
# Last line: "lint: N passed, M failed" (one per check); exits non-zero on a failure.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
export PATH="$HOME/.cargo/bin:$PATH"

# Each entry: a Cargo.toml, then the feature sets its clippy runs with, separated by ';'
# ("default": the crate's default features; else a comma-separated list of features).
# A new crate is one more line here, e.g.  "examples/charges-api/Cargo.toml;default"
CRATES=(
    "Cargo.toml;default;pg_test"
    "clients/rust/Cargo.toml;default;reqwest"
    "examples/charges-api/Cargo.toml;default"
    "bench/http/axum/Cargo.toml;default"
)
# The client crate and the example service share one target folder (as their tests build them).
CLIENTS_TARGET=$PWD/target/clients

RUFF_VERSION=0.17.5
LINT_VENV=$PWD/target/lint-venv
GROUPS_WANTED=("$@")
[ $# -gt 0 ] || GROUPS_WANTED=(rust shell python js hygiene)
for g in "${GROUPS_WANTED[@]}"; do
    case $g in rust|shell|python|js|hygiene) ;; *) echo "lint.sh: unknown group '$g'" >&2; exit 2 ;; esac
done
wanted() { [[ " ${GROUPS_WANTED[*]} " == *" $1 "* ]]; }

passed=0
failed=0
check() { # check NAME COMMAND...
    local name=$1
    shift
    echo "== $name: $*"
    if "$@"; then
        passed=$((passed + 1))
        echo "ok   $name"
    else
        failed=$((failed + 1))
        echo "FAIL $name"
    fi
}
cannot() { # cannot NAME WHY: a check that could not run counts as failed
    failed=$((failed + 1))
    echo "FAIL $1: $2"
}

lint_rust() {
    local entry manifest features parts target flags
    for entry in "${CRATES[@]}"; do
        IFS=';' read -r -a parts <<<"$entry"
        manifest=${parts[0]}
        target=()
        [ "$manifest" = Cargo.toml ] || target=(env CARGO_TARGET_DIR="$CLIENTS_TARGET")
        check "fmt $manifest" cargo fmt --manifest-path "$manifest" --check
        for features in "${parts[@]:1}"; do
            flags=()
            [ "$features" = default ] || flags=(--features "$features")
            check "clippy $manifest ($features)" \
                "${target[@]}" cargo clippy --locked --manifest-path "$manifest" --all-targets "${flags[@]}" -- -D warnings
        done
    done
}

# Every shell script of ours: *.sh, and files whose first line runs bash or sh.
shell_scripts() {
    local f
    git ls-files scripts tests bench packaging clients .ci | while read -r f; do
        case $f in
        *.sh) echo "$f" ;;
        *) head -n 1 "$f" 2>/dev/null | grep -qE '^#!.*\b(ba)?sh\b' && echo "$f" ;;
        esac
    done
}

lint_shell() {
    if ! command -v shellcheck >/dev/null; then
        cannot shellcheck "shellcheck is missing: scripts/install-deps.sh installs it"
        return
    fi
    local files
    mapfile -t files < <(shell_scripts)
    check "shellcheck ($(shellcheck --version | sed -n 's/^version: //p'), ${#files[@]} scripts)" shellcheck "${files[@]}"
}

lint_python() {
    if [ "$("$LINT_VENV/bin/ruff" --version 2>/dev/null)" != "ruff $RUFF_VERSION" ]; then
        echo "== ruff $RUFF_VERSION into $LINT_VENV"
        if ! { /usr/bin/python3 -m venv "$LINT_VENV" &&
                "$LINT_VENV/bin/pip" install -q --disable-pip-version-check "ruff==$RUFF_VERSION"; }; then
            cannot ruff "ruff $RUFF_VERSION could not be installed into $LINT_VENV"
            return
        fi
    fi
    check "ruff $RUFF_VERSION" "$LINT_VENV/bin/ruff" check --no-cache .
}

lint_js() {
    if ! [ -x clients/node/node_modules/.bin/eslint ] || ! (cd clients/node && npm ls --depth=0 >/dev/null 2>&1); then
        echo "== npm ci (clients/node)"
        (cd clients/node && npm ci --no-audit --no-fund --loglevel=error) ||
            { cannot eslint "npm ci in clients/node failed"; return; }
    fi
    check "eslint $(clients/node/node_modules/.bin/eslint --version)" \
        clients/node/node_modules/.bin/eslint --config clients/node/eslint.config.js clients/node examples/clients/node
}

lint_hygiene() {
    check "test hygiene: the check's own patterns" scripts/check-test-hygiene.sh --self-test
    check "test hygiene: no /proc/sys, no port outside tests/lib.sh's table" scripts/check-test-hygiene.sh
}

for g in "${GROUPS_WANTED[@]}"; do "lint_$g"; done

echo "lint: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
