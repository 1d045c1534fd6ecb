#!/usr/bin/env bash
# META.json (PGXN) against the rest of the tree: valid JSON with the fields PGXN's meta spec
# 1.0.0 requires, and one version everywhere: Cargo.toml, idempotency.control, META.json
# (the distribution and what it provides), packaging/debian/changelog, the portable
# edition's control file, and both editions' frozen release scripts for it (scripts/release.sh
# moves them all), which are the only release files in sql/. No build, no server: seconds.
#   tests/package/meta.sh
set -uo pipefail
. "$(dirname "$0")/../lib.sh" || exit 2
cd "$ROOT" || exit 2

version=$(extension_version)
meta() { # meta PYTHON-EXPRESSION-ON-m: prints its value (or an error line)
    /usr/bin/python3 -c "import json,sys; m = json.load(open('META.json')); print($1)" 2>&1 | tail -1
}
check "META.json is valid JSON" ok "$(meta '"ok"')"
check "META.json has every field PGXN requires" "" \
    "$(meta '" ".join(k for k in ["name", "abstract", "version", "maintainer", "license", "provides", "meta-spec"] if k not in m)')"
check "META.json: meta-spec 1.0.0" 1.0.0 "$(meta 'm["meta-spec"]["version"]')"
check "META.json: name" idempotency "$(meta 'm["name"]')"
check "META.json: license is Cargo.toml's (MIT)" "$(sed -n 's/^license = "\(.*\)"/\1/p' Cargo.toml | tr '[:upper:]' '[:lower:]')" "$(meta 'm["license"]')"
check "META.json: version is Cargo.toml's" "$version" "$(meta 'm["version"]')"
check "META.json: provides idempotency at Cargo.toml's version" "$version" "$(meta 'm["provides"]["idempotency"]["version"]')"
check "META.json: provides' file is the frozen install script of $version" "sql/releases/idempotency--$version.sql" \
    "$(meta 'm["provides"]["idempotency"]["file"]')"
check "META.json: a PostgreSQL runtime prereq" 1 "$(meta '1 if "PostgreSQL" in m["prereqs"]["runtime"]["requires"] else 0')"
control=$(sed -n "s/^default_version = '\(.*\)'/\1/p" idempotency.control)
# pgrx writes Cargo.toml's version over @CARGO_VERSION@ at build time.
check "idempotency.control's default_version is Cargo.toml's" "$version" "${control/@CARGO_VERSION@/$version}"
check "packaging/debian/changelog's latest entry is Cargo.toml's version" "$version" \
    "$(sed -n '1s/^idempotency (\([^)]*\)).*/\1/p' packaging/debian/changelog)"
check "sql/releases holds the frozen install script of $version" yes \
    "$([ -f "sql/releases/idempotency--$version.sql" ] && echo yes || echo no)"
# sql/ keeps the current release's files only: a past release's are in git history
# (sql/releases/past.tsv, scripts/past-releases.sh).
check "sql/ holds no release file of a past release (they are in git history: sql/releases/past.tsv)" "" \
    "$(find sql -name 'idempotency--*.sql' -o -name 'idempotency-portable--*.sql' | grep -v -- '--.*--' |
        grep -Fvx -e "sql/releases/idempotency--$version.sql" -e "sql/portable/idempotency-portable--$version.sql")"
check "the portable edition's control file says default_version $version" "$version" \
    "$(sed -n "s/^default_version = '\(.*\)'/\1/p" sql/portable/idempotency-portable.control)"
check "sql/portable holds the portable edition's release file of $version" yes \
    "$([ -f "$(portable_script)" ] && echo yes || echo no)"

finish meta
