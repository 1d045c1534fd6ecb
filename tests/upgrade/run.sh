#!/usr/bin/env bash
# Releases and upgrades. Every released version's install script is frozen in
# sql/releases/idempotency--VERSION.sql and never edited; each later release ships
# sql/idempotency--OLD--NEW.sql (cargo pgrx install copies those next to the install script).
#
#   1. The current version, if it is released, must install exactly what its frozen script
#      installs: a change to the SQL after a release needs a new version and an upgrade script.
#   2. Every older released version is installed from its frozen script, with live data, then
#      ALTER EXTENSION idempotency UPDATE: the result must match a fresh install of the current
#      version object for object (tests/upgrade/describe.sql), and keep the data.
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

for frozen in sql/releases/idempotency--*.sql; do
    [ -e "$frozen" ] || continue
    version=${frozen##*/idempotency--}
    version=${version%.sql}
    db="from_${version//[^0-9a-z]/_}"
    # The frozen script under a version name of its own, so that it cannot shadow the
    # installed one; upgrade scripts from the real version name are copied alongside.
    target="$EXTDIR/idempotency--$version-frozen.sql"
    cp "$frozen" "$target"; copied+=("$target")
    for up in sql/idempotency--"$version"--*.sql; do
        [ -e "$up" ] || continue
        t="$EXTDIR/idempotency--$version-frozen--${up##*/idempotency--"$version"--}"
        cp "$up" "$t"; copied+=("$t")
    done
    q -d postgres -c "CREATE DATABASE $db"
    q -d "$db" -c "CREATE EXTENSION idempotency VERSION '$version-frozen'"
    q -d "$db" -c "SELECT outcome FROM idempotency.idem_claim('upgrade', 'kept')" >/dev/null
    if [ "$version" = "$current" ]; then
        check "release $version: the current build installs exactly its frozen script" "$fresh" "$(describe "$db")"
    else
        q -d "$db" -c "ALTER EXTENSION idempotency UPDATE TO '$current'"
        check "upgrade $version -> $current matches a fresh install" "$fresh" "$(describe "$db")"
        check "upgrade $version -> $current keeps the data" "in_progress" \
            "$(q -d "$db" -c "SELECT outcome FROM idempotency.idem_claim('upgrade', 'kept')")"
    fi
done

finish upgrade
