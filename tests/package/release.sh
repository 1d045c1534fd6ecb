#!/usr/bin/env bash
# scripts/release.sh in a scratch copy of the tree (its tracked and new files, as they are in
# the working tree): `scripts/release.sh 0.0.0-test`, a real release with its native freeze
# (a release build of the extension for PostgreSQL 15, in this tree's target folder, so that
# after the package suite's build only the crate itself is built again: seconds), then
#   - no file states the old version where a version moves: every mention left is in a
#     history file (changelogs, BENCHMARKS.md, frozen release and upgrade scripts) or on the
#     short list of history lines below;
#   - Cargo.toml, Cargo.lock, META.json, the control files, the Debian changelog, the switch
#     scripts and the documentation's file names say the new version;
#   - the portable release file of the new version and pgtle.sql exist and say it; the
#     upgrade scripts' skeletons of both editions exist;
#   - the native install script frozen for the new version is the current release's SQL (no
#     SQL changed; pgrx's comments aside), and the meta suite, run in the scratch copy, passes;
#   - the old release's files left the tree: sql/releases/past.tsv names the commit before the
#     release for it, and scripts/past-releases.sh reads them back from there unchanged (while
#     this tree has not frozen the old release's native script yet, the scratch copy freezes
#     it first, as the end of that release will);
#   - a second run, or a malformed version, refuses and changes nothing.
#   - the portable release OLD plus the skeleton upgrade file equals a fresh install of the
#     new portable release file (a throwaway PostgreSQL cluster on a unix socket).
# What it does not check: the native skeleton as an update script (tests/upgrade/run.sh does,
# for every release once it is made).
#   tests/package/release.sh
set -uo pipefail
. "$(dirname "$0")/../lib.sh" || exit 2
cd "$ROOT" || exit 2
NEW=0.0.0-test
OLD=$(extension_version)
SCRATCH=$(dir_of release)/tree
rm -rf "$(dir_of release)" && mkdir -p "$SCRATCH"
trap 'cluster_stop "$(dir_of release)/pg"; rm -rf "$(dir_of release)"' EXIT

# The working tree's files (tracked and new, not ignored), into a fresh git repository.
while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done < <(git ls-files -z -co --exclude-standard) |
    tar --null -T - -cf - | tar -x -C "$SCRATCH"
g() { git -C "$SCRATCH" -c user.name=release-test -c user.email=release-test@invalid "$@"; }
g init -q && g add -A && g commit -qm "before the release"

# A release starts from a frozen, committed one (scripts/release.sh retires its files to the
# history). Before the end of this one, the scratch copy freezes it as that end will.
if [ ! -f "$SCRATCH/sql/releases/idempotency--$OLD.sql" ]; then
    echo "$OLD's native install script is not frozen here yet: scripts/release.sh --freeze in the scratch copy first"
    out=$(cd "$SCRATCH" && CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target} scripts/release.sh --freeze 2>&1)
    check "scripts/release.sh --freeze (at $OLD, in the scratch copy) succeeds" 0 "$?"
    while IFS= read -r line; do echo "  release.sh: $line"; done <<<"$out"
    g add -A && g commit -qm "$OLD frozen"
fi
BEFORE=$(g rev-parse HEAD)
# OLD's release files as the tree has them, to compare with what the history gives back.
mkdir -p "$(dir_of release)/old"
cp "$SCRATCH/sql/releases/idempotency--$OLD.sql" "$SCRATCH/sql/portable/idempotency-portable--$OLD.sql" "$(dir_of release)/old/"

out=$(cd "$SCRATCH" && CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target} scripts/release.sh "$NEW" 2>&1)
status=$?
while IFS= read -r line; do echo "  release.sh: $line"; done <<<"$out"
check "scripts/release.sh $NEW succeeds" 0 "$status"
o=${OLD//./\\.}
# A mention of OLD as a version (for 1.2.3: not 1.2.30, nor 11.2.3).
mentions() { g grep -nE "(^|[^0-9.])$o(\$|[^0-9.]|\\.[^0-9])" -- "$@"; }

# Files that record the past by design. The portable edition's sources (where the tree
# assembles it: sql/portable/functions/, sql/portable/*.sql.in) write the current version as
# {{version}}, so a version written there is a note on history too.
HISTORY=(':!CHANGELOG.md' ':!BENCHMARKS.md' ':!packaging/debian/changelog' ':!sql/releases/'
    ':!sql/idempotency--*--*.sql' ':!sql/portable/idempotency-portable--*.sql'
    ':!sql/portable/pgtle.sql' ':!sql/portable/functions/' ':!sql/portable/*.sql.in'
    ':!*.lock' ':!*package-lock.json' ':!bench/')
# Lines elsewhere that name a release as history (true whatever the version is now). Drop
# an entry once the version has moved past the release it names.
# Also, anywhere: a version in parentheses, "(X)", "(X: ...", "(X; ...", "(X, ...", the
# docs' mark of the release that brought a thing, and "before X", "since X", "from X",
# "new in X", "Release X", "extension X" (a client's note of the release it needs), an
# upgrade path "W -> X", "W to X", "W--X.sql", and "X's ". bench/ names the releases it
# compares.
V='[0-9]+\.[0-9]+\.[0-9]+'
HISTORY_LINES="\\(${V}[),:;]|([Bb]efore|[Ss]ince|new in|[Rr]elease|[Ff]rom|extension) $V|$V (->|to) $V|--$V\\.sql|$V's |"'^docs/portable\.md:[0-9]+:\*\*Fixed in 0\.4\.1: |^docs/portable\.md:[0-9]+:.*0\.4\.0 -> 0\.4\.1|^docs/portable\.md:[0-9]+:.*(The native 0\.4\.1 view|The edits of 0\.4\.1, both unified in 0\.5\.0)'
check "no file states $OLD where the version moves (history files and lines aside)" "" \
    "$(mentions "${HISTORY[@]}" | grep -Ev "$HISTORY_LINES")"
# shellcheck disable=SC2016 # $_pgtle_$ is a dollar quote, not an expansion
check "pgtle.sql's header (before the release file) no longer states $OLD" "" \
    "$(sed -n '1,/^\$_pgtle_\$$/p' "$SCRATCH/sql/portable/pgtle.sql" | grep -nE "(^|[^0-9.])$o(\$|[^0-9.])")"

# Each place says the new version.
check "Cargo.toml" "$NEW" "$(sed -n 's/^version = "\(.*\)"/\1/p' "$SCRATCH/Cargo.toml" | head -n 1)"
check "Cargo.lock's idempotency entry" "$NEW" \
    "$(awk '/^name = / { mine = ($0 == "name = \"idempotency\"") } mine && /^version = / { print; exit }' "$SCRATCH/Cargo.lock" | sed 's/^version = "\(.*\)"/\1/')"
check "the portable control file" "default_version = '$NEW'" "$(grep '^default_version' "$SCRATCH/sql/portable/idempotency-portable.control")"
check "the Debian changelog's new entry" "idempotency ($NEW) bookworm; urgency=medium" "$(head -n 1 "$SCRATCH/packaging/debian/changelog")"
check "the Debian changelog keeps the old entries" "$(cat packaging/debian/changelog)" \
    "$(tail -n +7 "$SCRATCH/packaging/debian/changelog")"
check "the switch scripts name $NEW" "2" "$(cat "$SCRATCH"/sql/portable/switch-*.sql | grep -c "VERSION '$NEW'\|\\\\ir idempotency-portable--$NEW.sql")"
check "the README names the portable release file of $NEW" 1 "$(grep -c "idempotency-portable--$NEW\\.sql" "$SCRATCH/README.md")"
check "docs/packages.md names the $NEW package files" 3 \
    "$(grep -c "idempotency_${NEW}_amd64\\.deb\|idempotency-$NEW-pg18-amd64\\.tar\\.gz" "$SCRATCH/docs/packages.md")"

# The new files.
release=$SCRATCH/sql/portable/idempotency-portable--$NEW.sql
check "the portable release file of $NEW: its first line and portable_version() say $NEW" "2" \
    "$( (sed -n "1{/ $NEW, PORTABLE EDITION/p}" "$release"; grep -x "AS \\\$\\\$ SELECT '$NEW' \\\$\\\$;" "$release") 2>/dev/null | grep -c .)"
# shellcheck disable=SC2016 # $_pgtle_$ is a dollar quote, not an expansion
check "pgtle.sql holds the portable release file of $NEW unchanged" "" \
    "$(diff <(sed -n '/^\$_pgtle_\$$/,/^\$_pgtle_\$$/p' "$SCRATCH/sql/portable/pgtle.sql" | sed '1d;$d') "$release" 2>&1 | head -n 5)"
check "pgtle.sql registers version $NEW" 1 "$(grep -cx "    '$NEW'," "$SCRATCH/sql/portable/pgtle.sql")"
check "the native upgrade script's skeleton $OLD -> $NEW" 1 \
    "$(grep -c "ALTER EXTENSION idempotency UPDATE TO '$NEW'" "$SCRATCH/sql/idempotency--$OLD--$NEW.sql" 2>/dev/null)"
check "the portable upgrade file's skeleton $OLD -> $NEW: checks for $OLD, ends at $NEW" "2" \
    "$(grep -c "IS DISTINCT FROM '$OLD' THEN\|SELECT '$NEW' \\\$\\\$;" "$SCRATCH/sql/portable/idempotency-portable--$OLD--$NEW.sql" 2>/dev/null)"

# OLD's release files: out of the tree, into the history.
check "$OLD's release files left the tree" "" \
    "$(ls "$SCRATCH/sql/releases/idempotency--$OLD.sql" "$SCRATCH/sql/portable/idempotency-portable--$OLD.sql" 2>/dev/null)"
check "sql/releases/past.tsv's last line: $OLD at the commit before the release, both editions" \
    "$OLD $BEFORE native,portable" "$(tail -n 1 "$SCRATCH/sql/releases/past.tsv" | tr '\t' ' ')"
for edition in native portable; do
    case $edition in
    native) file=idempotency--$OLD.sql ;;
    portable) file=idempotency-portable--$OLD.sql ;;
    esac
    (cd "$SCRATCH" && scripts/past-releases.sh show "$OLD" "$edition") >"$(dir_of release)/from-history-$file" 2>&1
    check "scripts/past-releases.sh show $OLD $edition gives back $file as it was" "" \
        "$(diff "$(dir_of release)/old/$file" "$(dir_of release)/from-history-$file" | head -n 5)"
done

# The native freeze: the build's install script for NEW, the SQL of OLD (nothing changed).
check "the native install script frozen for $NEW is $OLD's SQL (comments aside)" "" \
    "$(diff <(grep -v '^--' "$(dir_of release)/old/idempotency--$OLD.sql") \
        <(grep -v '^--' "$SCRATCH/sql/releases/idempotency--$NEW.sql" 2>&1) | head -n 5)"
# The meta suite in the scratch copy.
meta=$(cd / && env -u ROOT bash "$SCRATCH/tests/package/meta.sh" 2>&1)
check "the meta suite in the scratch copy: no check fails" "" "$(grep '^FAIL' <<<"$meta")"
check_match "... and it ran" '^meta: [0-9]+ passed, 0 failed$' "$(tail -n 1 <<<"$meta")"

# What release.sh wrote upgrades: the portable release OLD plus the skeleton upgrade file is a
# fresh install of NEW (the upgrade suite's comparison, on a unix-socket-only cluster).
if use_major "${PG_MAJOR:-15}" 2>/dev/null; then
    pgdir=$(dir_of release)/pg
    if cluster_fresh "$pgdir" "$(port_of parity)" >/dev/null; then
        pq() { psql -X -q -At -v ON_ERROR_STOP=1 -h "$pgdir/socket" -p "$(port_of parity)" -U postgres "$@"; }
        pq -d postgres -c "CREATE DATABASE fresh" -c "CREATE DATABASE upgraded"
        pq -d fresh -1 -f "$release" >/dev/null
        pq -d upgraded -1 -f "$(dir_of release)/from-history-idempotency-portable--$OLD.sql" >/dev/null
        pq -d upgraded -1 -f "$SCRATCH/sql/portable/idempotency-portable--$OLD--$NEW.sql" >/dev/null
        check "portable $OLD + the skeleton upgrade file = a fresh install of $NEW (tests/upgrade/describe.sql)" \
            "$(pq -d fresh -f "$SCRATCH/tests/upgrade/describe.sql")" "$(pq -d upgraded -f "$SCRATCH/tests/upgrade/describe.sql")"
        cluster_stop "$pgdir"
    else
        fail "a PostgreSQL $PG_MAJOR cluster in $pgdir"
    fi
else
    skip "portable $OLD + the skeleton upgrade file = a fresh install of $NEW" "no PostgreSQL ${PG_MAJOR:-15} here"
fi

# Refusals change nothing.
g add -A && g commit -qm "after the release"
for bad in "$NEW" 1.2 0.0.0--x -rc1; do
    (cd "$SCRATCH" && scripts/release.sh --no-build "$bad" >/dev/null 2>&1)
    check "release.sh $bad refuses (exit 2) and changes nothing" "2 " "$? $(g status --porcelain)"
done

finish release
