#!/usr/bin/env bash
# The install scripts of past releases, read from git history. sql/ holds the sources and the
# current release's files only; sql/releases/past.tsv names, for each past release, the commit
# that holds its install scripts (git show COMMIT:PATH):
#   native    sql/releases/idempotency--VERSION.sql
#   portable  sql/portable/idempotency-portable--VERSION.sql
#
#   scripts/past-releases.sh list EDITION          the past releases of EDITION (native or
#                                                  portable), oldest first; no git needed
#   scripts/past-releases.sh show VERSION EDITION  that release's install script, on stdout
#   scripts/past-releases.sh commit VERSION        the commit the table names for VERSION
#   scripts/past-releases.sh check                 the history holds every file of the table
#   scripts/past-releases.sh add VERSION COMMIT EDITION...   a new line (scripts/release.sh,
#                                                  when it starts the next release)
#
# Exit status: 0; 1 when the table is malformed, or the history is here but lacks a file the
# table names (a wrong commit, or one rewritten away); 2 on bad arguments or a version the
# table lacks; 3 when this tree has no history of its own (a shallow clone, a tarball, no
# git): the message says so, and the suites that need the past releases skip those checks
# with it, never counting them as passed.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd -P)
TABLE=$ROOT/sql/releases/past.tsv

usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
die() { echo "past-releases.sh: $2" >&2; exit "$1"; }

path_of() { # path_of VERSION EDITION: the file's path in its commit
    case $2 in
    native) echo "sql/releases/idempotency--$1.sql" ;;
    portable) echo "sql/portable/idempotency-portable--$1.sql" ;;
    *) die 2 "unknown edition '$2' (native or portable)" ;;
    esac
}

# The table's lines, "VERSION COMMIT EDITIONS", each checked.
rows() {
    local n=0 version commit editions rest e
    local -A seen=()
    [ -f "$TABLE" ] || die 1 "no ${TABLE#"$ROOT"/}"
    while IFS=$'\t' read -r version commit editions rest; do
        n=$((n + 1))
        [[ -z $version || $version == \#* ]] && continue
        [[ $version =~ ^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$ && $commit =~ ^[0-9a-f]{40}$ && -n $editions && -z $rest ]] ||
            die 1 "${TABLE#"$ROOT"/}:$n: not VERSION<tab>COMMIT (40 hex digits)<tab>EDITIONS"
        for e in ${editions//,/ }; do
            [[ $e == native || $e == portable ]] || die 1 "${TABLE#"$ROOT"/}:$n: unknown edition '$e'"
        done
        [ -z "${seen[$version]:-}" ] || die 1 "${TABLE#"$ROOT"/}:$n: $version twice"
        seen[$version]=1
        echo "$version $commit $editions"
    done <"$TABLE"
}

commit_of() { # commit_of VERSION [EDITION]
    local row
    row=$(rows | awk -v v="$1" -v e="${2:-}" '$1 == v && (e == "" || ("," $3 ",") ~ ("," e ",")) { print $2 }') || exit
    [ -n "$row" ] || die 2 "no past release $1${2:+ of the $2 edition} in ${TABLE#"$ROOT"/}"
    echo "$row"
}

# Why this tree has no git history of its own, if it has none (else nothing).
no_history() {
    local top
    command -v git >/dev/null || { echo "git is not installed"; return; }
    if [ -e "$ROOT/.git" ] && ! top=$(git -C "$ROOT" rev-parse --show-toplevel 2>&1); then
        echo "git cannot read $ROOT/.git ($top)"
    elif [ ! -e "$ROOT/.git" ]; then
        echo "$ROOT is not a git checkout (a tarball?)"
    elif [ "$(git -C "$ROOT" rev-parse --is-shallow-repository)" = true ]; then
        echo "a shallow clone (git fetch --unshallow brings the history)"
    fi
}

# missing COMMIT:PATH: exits 3 if the history is not here, 1 if it is and lacks the file.
missing() {
    local why
    why=$(no_history)
    [ -n "$why" ] && die 3 "no git history of the past releases here, $why: $1 (${TABLE#"$ROOT"/})"
    die 1 "the history lacks $1, which ${TABLE#"$ROOT"/} names (a wrong commit, or one rewritten away)"
}

command=${1:-}
[ $# -gt 0 ] && shift
case $command in
list)
    [ $# -eq 1 ] || die 2 "usage: list native|portable"
    path_of 0 "$1" >/dev/null
    table=$(rows) || exit
    awk -v e="$1" '("," $3 ",") ~ ("," e ",") { print $1 }' <<<"$table" | sort -V
    ;;
show)
    [ $# -eq 2 ] || die 2 "usage: show VERSION native|portable"
    file=$(path_of "$1" "$2") || exit
    commit=$(commit_of "$1" "$2") || exit
    git -C "$ROOT" cat-file -e "$commit:$file" 2>/dev/null || missing "$commit:$file"
    git -C "$ROOT" show "$commit:$file"
    ;;
commit)
    [ $# -eq 1 ] || die 2 "usage: commit VERSION"
    commit_of "$1"
    ;;
check)
    [ $# -eq 0 ] || die 2 "usage: check"
    table=$(rows) || exit
    while read -r version commit editions; do
        for e in ${editions//,/ }; do
            file=$(path_of "$version" "$e")
            git -C "$ROOT" cat-file -e "$commit:$file" 2>/dev/null || missing "$commit:$file"
        done
    done <<<"$table"
    ;;
add)
    [ $# -ge 3 ] || die 2 "usage: add VERSION COMMIT EDITION..."
    version=$1 commit=$2; shift 2
    rows | awk -v v="$version" '$1 == v { found = 1 } END { exit found }' ||
        die 2 "${TABLE#"$ROOT"/} has $version already: a line never changes"
    for e in "$@"; do
        file=$(path_of "$version" "$e") || exit
        git -C "$ROOT" cat-file -e "$commit:$file" 2>/dev/null || missing "$commit:$file"
    done
    printf '%s\t%s\t%s\n' "$version" "$commit" "$(IFS=,; echo "$*")" >>"$TABLE"
    (rows >/dev/null) || { sed -i '$d' "$TABLE"; exit 1; }
    ;;
-h | --help) usage ;;
*) usage >&2; exit 2 ;;
esac
