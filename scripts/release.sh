#!/usr/bin/env bash
# One command for a release (CONTRIBUTING.md, "Adding a release"):
#
#   scripts/release.sh VERSION             move every version string from Cargo.toml's version
#                                          (OLD) to VERSION, write the upgrade scripts'
#                                          skeletons OLD -> VERSION, freeze both editions, and
#                                          retire OLD's release files: they leave the tree, and
#                                          sql/releases/past.tsv records the commit (HEAD) that
#                                          holds them (OLD must be frozen and committed)
#   scripts/release.sh --no-build VERSION  the same, but leave the native freeze (which builds
#                                          the extension: minutes) for --freeze
#   scripts/release.sh --freeze            freeze both editions again at Cargo.toml's version,
#                                          after the SQL changed during the release (before it
#                                          is published: a published release file never changes)
#
# Cargo.toml's version is the one place the version is kept: tests and scripts read it
# (tests/lib.sh's extension_version); what cannot read it is moved here (move_versions below
# lists every such place). tests/package/release.sh runs this in a scratch clone and checks
# that no old version string is left where one should move.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"

die() { echo "release.sh: $*" >&2; exit 2; }
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }

current_version() { sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1; }
# A version as a sed pattern (its dots literal).
pattern() { printf '%s' "$1" | sed 's/[.]/\\./g'; }

# --- 1. the version strings --------------------------------------------------------------

# Every place that states the current version and cannot read it from Cargo.toml.
# Files where every mention is the current version: the switch scripts (they switch at
# the one release both editions share). Documentation: only the forms that name the current
# release (its files, VERSION '...'); mentions of older releases there are history.
SWITCH_SCRIPTS="sql/portable/switch-native-to-portable.sql sql/portable/switch-portable-to-native.sql"
DOCS="README.md CONTRIBUTING.md docs/*.md"

move_versions() { # move_versions OLD NEW
    local old new o f
    old=$1 new=$2 o=$(pattern "$1")
    # Cargo.toml: the package's own version (the first "version =" line, in [package]).
    sed -i "0,/^version = \"$o\"$/s//version = \"$new\"/" Cargo.toml
    # Cargo.lock: the idempotency package's entry (cargo would rewrite it at the next build).
    awk -v old="$old" -v new="$new" '
        /^name = / { mine = ($0 == "name = \"idempotency\"") }
        mine && $0 == "version = \"" old "\"" { $0 = "version = \"" new "\""; mine = 0 }
        { print }' Cargo.lock >Cargo.lock.new && mv Cargo.lock.new Cargo.lock
    # idempotency.control says @CARGO_VERSION@: pgrx writes Cargo.toml's version over it.
    sed -i "s/^default_version = '$o'$/default_version = '$new'/" sql/portable/idempotency-portable.control
    # META.json (PGXN): the distribution's and the provided extension's version, its file.
    /usr/bin/python3 - "$new" <<'PY'
import json, sys
new = sys.argv[1]
with open("META.json") as f:
    meta = json.load(f)
meta["version"] = new
meta["provides"]["idempotency"].update(version=new, file=f"sql/releases/idempotency--{new}.sql")
with open("META.json", "w") as f:
    f.write(json.dumps(meta, indent=3, ensure_ascii=False) + "\n")
PY
    # packaging/debian/changelog: a new entry on top (scripts/package.sh needs it).
    if [ "$(sed -n '1s/^idempotency (\([^)]*\)).*/\1/p' packaging/debian/changelog)" != "$new" ]; then
        {
            printf 'idempotency (%s) bookworm; urgency=medium\n\n' "$new"
            printf '  * Release %s. Upgrade script %s -> %s.\n\n' "$new" "$old" "$new"
            printf ' -- @MAINTAINER@  %s\n\n' "$(LC_ALL=C date -u -R)"
            cat packaging/debian/changelog
        } >packaging/debian/changelog.new && mv packaging/debian/changelog.new packaging/debian/changelog
    fi
    # The switch scripts: both editions at one release. (Their psql variable is named
    # after no version, so that only the version moves.)
    for f in $SWITCH_SCRIPTS; do sed -i "s/$o/$new/g" "$f"; done
    # The documentation's names of the current release's files and VERSION clauses.
    # shellcheck disable=SC2086 # DOCS is a list of globs
    for f in $DOCS; do
        sed -i -e "s/idempotency-portable--$o\\.sql/idempotency-portable--$new.sql/g" \
            -e "s/idempotency--$o\\.sql/idempotency--$new.sql/g" \
            -e "s/idempotency_${o}_amd64\\.deb/idempotency_${new}_amd64.deb/g" \
            -e "s/idempotency-$o-pg\\([0-9]*\\)-/idempotency-$new-pg\\1-/g" \
            -e "s/VERSION '$o'/VERSION '$new'/g" "$f"
    done
}

# --- 2. the upgrade scripts' skeletons ---------------------------------------------------

write_upgrade_skeletons() { # write_upgrade_skeletons OLD NEW: writes only files not there yet
    local old=$1 new=$2 native portable
    native=sql/idempotency--$old--$new.sql
    portable=sql/portable/idempotency-portable--$old--$new.sql
    if [ ! -e "$native" ]; then
        cat >"$native" <<EOF
-- idempotency $old -> $new. Frozen once released, as every upgrade script.
-- It brings a database at $old to exactly what a fresh install of $new creates, keeping the
-- data (tests/upgrade/run.sh compares the two). Say here, and in the changelogs, if it
-- rewrites a table or rebuilds an index: the UPDATE blocks writes meanwhile.
-- (Written by scripts/release.sh; with no change to the native SQL it stays as it is.)
\\echo Use "ALTER EXTENSION idempotency UPDATE TO '$new'" to load this file. \\quit
EOF
        echo "wrote $native (skeleton)"
    fi
    if [ ! -e "$portable" ]; then
        cat >"$portable" <<EOF
-- idempotency PORTABLE EDITION, $old -> $new, as the native sql/idempotency--$old--$new.sql.
-- Frozen once released, as every upgrade file.
--
-- Run once, in one transaction, by the owner of the portable install:
--     psql -v ON_ERROR_STOP=1 -1 -d DB -f sql/portable/idempotency-portable--$old--$new.sql
-- It works unchanged as an extension update script (idempotency--$old--$new.sql next to
-- the control file, or pgtle.install_update_path), then ALTER EXTENSION idempotency UPDATE.
--
-- What changes: (written by scripts/release.sh; with no change to the portable SQL but the
-- version, it stays as it is). tests/upgrade/run.sh checks that $old plus this file equals
-- a fresh install of $new.

-- Only over release $old: over another release it stops and changes nothing.
DO \$\$
DECLARE
    installed text;
BEGIN
    IF pg_catalog.to_regprocedure('idempotency.portable_version()') IS NOT NULL THEN
        EXECUTE 'SELECT idempotency.portable_version()' INTO installed;
    END IF;
    IF installed IS DISTINCT FROM '$old' THEN
        RAISE EXCEPTION 'this file upgrades the portable edition $old, but the release installed here is %',
                        coalesce(installed, 'none (no idempotency.portable_version())')
            USING ERRCODE = '55000', HINT = 'docs/portable.md, "Upgrades": run the upgrade files in order, each once.';
    END IF;
END
\$\$;

CREATE OR REPLACE FUNCTION idempotency.portable_version() RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS \$\$ SELECT '$new' \$\$;
EOF
        echo "wrote $portable (skeleton)"
    fi
}

# --- 3. freezing the release files -------------------------------------------------------

# The native install script: what the build generates (the same generator cargo pgrx install
# writes with), into sql/releases/. Builds the extension for PostgreSQL 15.
freeze_native() { # freeze_native VERSION
    local out=sql/releases/idempotency--$1.sql
    cargo pgrx schema --release --pg-config "${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}" \
        --no-default-features --features pg15 --out "$out"
    echo "froze $out"
}

# THE PORTABLE FREEZING STEP. The portable edition's release file (and pgtle.sql, which
# holds it) at VERSION: written by the assembler when the tree has one
# (scripts/assemble_portable.py, from the edition's sources); in a tree without it, the
# previous release file, copied, with the version its header and portable_version() state
# moved.
freeze_portable() { # freeze_portable OLD NEW
    local old=$1 new=$2 o out previous
    out=sql/portable/idempotency-portable--$new.sql
    if [ -f scripts/assemble_portable.py ]; then
        /usr/bin/python3 scripts/assemble_portable.py --version "$new"
        echo "froze $out and sql/portable/pgtle.sql (scripts/assemble_portable.py)"
        return
    fi
    previous=sql/portable/idempotency-portable--$old.sql
    [ -f "$previous" ] || die "no $previous to copy (and no scripts/assemble_portable.py)"
    o=$(pattern "$old")
    [ "$old" = "$new" ] || sed -e "1s/^-- idempotency $o, /-- idempotency $new, /" \
        -e "s/idempotency-portable--$o\\.sql/idempotency-portable--$new.sql/g" \
        -e "s/as the native $o,/as the native $new,/" \
        -e "s/^AS \\\$\\\$ SELECT '$o' \\\$\\\$;$/AS \$\$ SELECT '$new' \$\$;/" "$previous" >"$out"
    # pgtle.sql: its header (up to the opening quote) with the version moved, the release
    # file, the closing quote.
    local pgtle=sql/portable/pgtle.sql
    # shellcheck disable=SC2016 # $_pgtle_$ is a dollar quote, not an expansion
    {
        sed -n '1,/^\$_pgtle_\$$/p' "$pgtle" | sed -e "s/$o/$new/g"
        cat "$out"
        echo '$_pgtle_$'
        echo ');'
    } >"$pgtle.new" && mv "$pgtle.new" "$pgtle"
    echo "froze $out (a copy of $previous, version moved) and $pgtle"
}

# --- 4. retiring the previous release's files --------------------------------------------

# The release files of OLD: the native install script and the portable release file. sql/
# keeps the current release's only; a past release's are read from git history
# (scripts/past-releases.sh), at the commit sql/releases/past.tsv names.
release_files() { echo "sql/releases/idempotency--$1.sql sql/portable/idempotency-portable--$1.sql"; }

# Refuses (before anything changes) unless HEAD holds OLD's release files as they are here.
check_retirable() { # check_retirable OLD
    local f
    git rev-parse --verify -q HEAD >/dev/null || die "not a git checkout with a commit: the release files of $1 are retired to its history"
    for f in $(release_files "$1"); do
        [ -f "$f" ] || die "$f is missing: freeze $1 first (scripts/release.sh --freeze), commit, then start the next release"
        if ! git cat-file -e "HEAD:$f" 2>/dev/null || ! git diff --quiet HEAD -- "$f"; then
            die "$f is not committed as it is: commit it, so that sql/releases/past.tsv can name the commit that holds it"
        fi
    done
}

retire() { # retire OLD: its line in sql/releases/past.tsv (HEAD), its files out of the tree
    local files
    read -r -a files <<<"$(release_files "$1")"
    scripts/past-releases.sh add "$1" "$(git rev-parse HEAD)" native portable
    rm "${files[@]}"
    echo "retired ${files[*]} (sql/releases/past.tsv: $1 at $(git rev-parse --short HEAD))"
}

# --- the command -------------------------------------------------------------------------

build=1
freeze_only=0
while [ $# -gt 0 ]; do
    case $1 in
    --no-build) build=0; shift ;;
    --freeze) freeze_only=1; shift ;;
    -h|--help) usage; exit 0 ;;
    -*) die "unknown option $1 (see --help)" ;;
    *) break ;;
    esac
done
old=$(current_version)
[ -n "$old" ] || die "no version in Cargo.toml"

if [ "$freeze_only" = 1 ]; then
    [ $# -eq 0 ] || die "--freeze takes no VERSION: it freezes Cargo.toml's ($old)"
    freeze_portable "$old" "$old"
    [ "$build" = 1 ] && freeze_native "$old"
    exit 0
fi

[ $# -eq 1 ] || { usage >&2; exit 2; }
new=$1
# Semantic versioning (META.json needs it); PostgreSQL refuses "--" in a version name.
if ! [[ $new =~ ^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z]+([.-][0-9A-Za-z]+)*)?$ ]] || [[ $new == *--* ]]; then
    die "'$new' is not a version like 1.2.3 or 1.2.3-rc1"
fi
[ "$new" != "$old" ] || die "Cargo.toml is at $new already (scripts/release.sh --freeze freezes it again)"
[ "$(printf '%s\n%s\n' "$old" "$new" | sort -V | tail -n 1)" = "$new" ] ||
    echo "release.sh: note: $new sorts before $old" >&2
for f in $(release_files "$new"); do
    [ ! -e "$f" ] || die "$f exists already: a released file is frozen"
done
check_retirable "$old"

move_versions "$old" "$new"
echo "moved the version $old -> $new"
write_upgrade_skeletons "$old" "$new"
freeze_portable "$old" "$new"
retire "$old"
if [ "$build" = 1 ]; then
    freeze_native "$new"
else
    echo "the native install script is not frozen yet (--no-build): scripts/release.sh --freeze"
fi
cat <<EOF
Next: fill in the upgrade scripts (sql/idempotency--$old--$new.sql,
sql/portable/idempotency-portable--$old--$new.sql), describe the release in CHANGELOG.md and
packaging/debian/changelog, install the build and run scripts/test.sh upgrade meta parity.
EOF
