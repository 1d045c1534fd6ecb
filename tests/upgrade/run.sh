#!/usr/bin/env bash
# Releases and upgrades of both editions. Every released version's install script is frozen
# and never edited: the current release's in the tree (native:
# sql/releases/idempotency--VERSION.sql, which scripts/release.sh --freeze writes at the end
# of the release; portable: sql/portable/idempotency-portable--VERSION.sql), every past
# release's in git history, at the commit sql/releases/past.tsv names (read with
# scripts/past-releases.sh). Each later release ships upgrade scripts
# (sql/idempotency--OLD--NEW.sql, which cargo pgrx install copies next to the install script;
# sql/portable/idempotency-portable--OLD--NEW.sql).
#
#   1. The current version (Cargo.toml's), once frozen, must install exactly what its frozen
#      script installs: a change to the SQL after a release needs a new version.
#   2. Native: every past release is installed from its frozen script, with live data, then
#      ALTER EXTENSION idempotency UPDATE: the result must match a fresh install of the current
#      version object for object, and keep the data.
#   3. Portable: every past release is installed with psql -1 -f, with live data, then each
#      upgrade file from there on, in order, up to the current version: the same checks.
# Every comparison is tests/upgrade/describe.sql's description of the two databases. Without
# the git history (a shallow clone, a tarball) 2 and 3 are skipped, saying why; before the
# freeze, 1 is.
# Needs the current version installed into PG_MAJOR (15 or 18; cargo pgrx install).
# Last line: "upgrade: N passed, M failed".
#   tests/upgrade/run.sh [DIR] [PORT]
set -uo pipefail
. "$(dirname "$0")/../lib.sh" || exit 2
cd "$ROOT" || exit 2
DIR=${1:-$(dir_of upgrade)}
PORT=${2:-$(port_of upgrade)}
EXTDIR="$("$PGBIN/pg_config" --sharedir)/extension"
current=$(extension_version)

if ! extension_installed; then
    fail "the extension is installed into PostgreSQL $PG_MAJOR ($EXTDIR)"
    finish upgrade
    exit
fi
cluster_fresh "$DIR" "$PORT" || { fail "start the cluster"; finish upgrade; exit; }
copied=()
cleanup() {
    cluster_stop "$DIR"
    for f in "${copied[@]}"; do rm -f "$f"; done
}
trap cleanup EXIT
q() { psql -X -q -At -v ON_ERROR_STOP=1 -h "$DIR/socket" -p "$PORT" -U postgres "$@"; }
describe() { q -d "$1" -f tests/upgrade/describe.sql; }

q -d postgres -c "CREATE DATABASE fresh"
q -d fresh -c "CREATE EXTENSION idempotency"
fresh=$(describe fresh) || { echo "FAIL describing a fresh install"; failed=$((failed + 1)); }
check "the description lists every object" 1 "$([ "$(grep -c . <<<"$fresh")" -gt 40 ] && echo 1 || echo 0)"
check "a fresh install of $current has the contract's functions" 0 \
    "$(q -d fresh -c "SELECT count(*) FROM unnest(ARRAY['idem_claim','idem_complete','idem_checkpoint','idem_release','idem_lookup','idem_reclaim_stale','idem_sweep','idem_seen','idem_fingerprint']) f WHERE NOT EXISTS (SELECT FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'idempotency' AND p.proname = f)")"

# The past releases, out of git history; without it, skipped, saying why.
PAST=$DIR/past
mkdir -p "$PAST"
history=$(scripts/past-releases.sh check 2>&1)
case $? in
0) native_past=$(scripts/past-releases.sh list native) portable_past=$(scripts/past-releases.sh list portable) ;;
3) native_past="" portable_past=""
   skip "every past release of both editions, upgraded (sql/releases/past.tsv)" "$history" ;;
*) native_past="" portable_past=""
   fail "the past releases' install scripts, from git history" "$history" ;;
esac

# install_frozen VERSION SCRIPT: a database with SCRIPT installed as the extension at VERSION,
# and a claim in it. The script under a version name of its own, so that it cannot shadow the
# installed one; upgrade scripts from the real version name are copied alongside.
install_frozen() {
    local version=$1 db="from_${1//[^0-9a-z]/_}" target up t
    target="$EXTDIR/idempotency--$version-frozen.sql"
    cp "$2" "$target"; copied+=("$target")
    for up in sql/idempotency--"$version"--*.sql; do
        [ -e "$up" ] || continue
        t="$EXTDIR/idempotency--$version-frozen--${up##*/idempotency--"$version"--}"
        cp "$up" "$t"; copied+=("$t")
    done
    q -d postgres -c "CREATE DATABASE $db"
    q -d "$db" -c "CREATE EXTENSION idempotency VERSION '$version-frozen'"
    q -d "$db" -c "SELECT outcome FROM idempotency.idem_claim('upgrade', 'kept')" >/dev/null
}

for version in $native_past; do
    db="from_${version//[^0-9a-z]/_}"
    scripts/past-releases.sh show "$version" native >"$PAST/idempotency--$version.sql" ||
        { fail "release $version's native install script, from git history"; continue; }
    install_frozen "$version" "$PAST/idempotency--$version.sql"
    q -d "$db" -c "ALTER EXTENSION idempotency UPDATE TO '$current'"
    # From 0.6.0 on, idem_sweep moves the records of the tables a 0.5.0 database kept them in
    # into the partitions, and drops those tables once empty (as the owner, as here).
    q -d "$db" -c "SELECT idempotency.idem_sweep()" -c "SELECT idempotency.idem_sweep()" >/dev/null
    check "upgrade $version -> $current matches a fresh install" "$fresh" "$(describe "$db")"
    check "upgrade $version -> $current keeps the data" "in_progress" \
        "$(q -d "$db" -c "SELECT outcome FROM idempotency.idem_claim('upgrade', 'kept')")"
done

# The last release upgraded under load: claims and deliveries go on through the UPDATE and
# the sweeps that move the records into the partitions (tests/upgrade/under_load.py).
last=$(tr ' ' '\n' <<<"$native_past" | grep . | sort -V | tail -n 1)
if [ -n "$last" ] && [ -s "$PAST/idempotency--$last.sql" ]; then
    install_frozen "$last" "$PAST/idempotency--$last.sql"
    q -d postgres -c "CREATE DATABASE under_load"
    q -d under_load -c "CREATE EXTENSION idempotency VERSION '$last-frozen'"
    while read -r line; do
        case $line in
        ok\ *) ok "${line#ok   }" ;;
        FAIL\ *) line=${line#FAIL }; fail "${line%%: *}" "${line#*: }" ;;
        esac
    done < <(/usr/bin/python3 tests/upgrade/under_load.py --dsn "host=$DIR/socket port=$PORT user=postgres dbname=under_load" \
                 --seconds "${UPGRADE_LOAD_SECONDS:-6}" --target-version "$current" 2>&1)
fi

if [ -f "sql/releases/idempotency--$current.sql" ]; then
    install_frozen "$current" "sql/releases/idempotency--$current.sql"
    check "release $current: the current build installs exactly its frozen script" "$fresh" \
        "$(describe "from_${current//[^0-9a-z]/_}")"
else
    skip "release $current: the current build installs exactly its frozen script" \
        "not frozen yet (scripts/release.sh --freeze writes sql/releases/idempotency--$current.sql at the end of the release)"
fi

# --- the portable edition --------------------------------------------------------------

portable_fresh=$(portable_script)
# The upgrade file that starts at $1 (the lowest target if there were several).
portable_step() {
    local f
    for f in sql/portable/idempotency-portable--"$1"--*.sql; do [ -e "$f" ] && echo "$f"; done | sort -V | head -n 1
}

if [ ! -f "$portable_fresh" ]; then
    fail "the portable edition of $current exists ($portable_fresh)"
else
    q -d postgres -c "CREATE DATABASE portable_fresh"
    q -d portable_fresh -1 -f "$portable_fresh" >/dev/null
    pfresh=$(describe portable_fresh)
    check "portable: a fresh install of $current says portable_version() $current" "$current" \
        "$(q -d portable_fresh -c "SELECT idempotency.portable_version()")"
    for version in $portable_past; do
        db="portable_from_${version//[^0-9a-z]/_}"
        scripts/past-releases.sh show "$version" portable >"$PAST/idempotency-portable--$version.sql" ||
            { fail "release $version's portable release file, from git history"; continue; }
        q -d postgres -c "CREATE DATABASE $db"
        q -d "$db" -1 -f "$PAST/idempotency-portable--$version.sql" >/dev/null
        q -d "$db" -c "SELECT outcome FROM idempotency.idem_claim('upgrade', 'kept')" >/dev/null
        at=$version path=$version
        while [ "$at" != "$current" ]; do
            step=$(portable_step "$at")
            if [ -z "$step" ]; then
                fail "portable $version: an upgrade file from $at (sql/portable/idempotency-portable--$at--*.sql)"
                break
            fi
            if ! q -d "$db" -1 -f "$step" >"$DIR/step.log" 2>&1; then
                fail "portable $version: $step" "$(head -n 3 "$DIR/step.log")"
                break
            fi
            at=${step##*/idempotency-portable--"$at"--}; at=${at%.sql}
            path+=" -> $at"
        done
        [ "$at" = "$current" ] || continue
        # As for the native edition: idem_sweep moves the 0.5.0 tables' records and drops them.
        q -d "$db" -c "SELECT idempotency.idem_sweep()" -c "SELECT idempotency.idem_sweep()" >/dev/null
        check "portable upgrade $path matches a fresh install" "$pfresh" "$(describe "$db")"
        check "portable upgrade $path keeps the data" "in_progress" \
            "$(q -d "$db" -c "SELECT outcome FROM idempotency.idem_claim('upgrade', 'kept')")"
    done
fi

finish upgrade
