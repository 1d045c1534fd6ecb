#!/usr/bin/env bash
# The client packages built as their registries ship them:
#
#   scripts/build-artifacts.sh LANG [OUTDIR]     one language's artifacts into OUTDIR (made
#                                                empty first; default target/artifacts/LANG)
#   scripts/build-artifacts.sh --list            the languages it knows
#
#   python   the wheel and the sdist of clients/python (`python -m build`, with its isolated
#            build environment; `build` is installed into a throwaway venv when the Python at
#            hand lacks it). Versions pinned by clients/python/constraints.txt (PIP_CONSTRAINT).
#   node     the tarball npm would publish from clients/node (`npm pack`: the package.json
#            `files`, no install needed), pg-idempotency-VERSION.tgz
#   go       clients/go as the Go module proxy will serve it, in OUTDIR laid out as a module
#            proxy (GOPROXY=file://OUTDIR): github.com/idempotency/pg-idempotency-go/@v/ with
#            list, vX.Y.Z.info, .mod and .zip, X.Y.Z being clients/go/version.go's Version. The
#            module is checked as it is published first: no replace directive in its go.mod,
#            `go mod verify`. The zip is made by the go command itself (`go mod download`), from
#            a throwaway git repository holding the module's files (those git tracks or would:
#            not ignored) at its root, tagged vX.Y.Z, as the proxy fetches a published tag: no
#            network for the module itself.
#   rust     the .crate of clients/rust (`cargo package --locked`: the files crates.io would get,
#            unpacked and built on their own first); uncommitted changes are packed as they are
#            (--allow-dirty). Build output in CARGO_TARGET_DIR (default target/clients).
#   java     the Maven artifacts of clients/java as Central takes them: for core, servlet and
#            spring-boot-starter the jar, its -sources.jar and -javadoc.jar and its pom, and the
#            parent pom (pg-idempotency-parent-VERSION.pom). Built by `mvn package` in a copy of
#            clients/java (the clone's target/ folders are left alone), the sources and javadoc
#            jars by the JDK's jar and javadoc (no Maven plugin beyond those the tests fetch).
#
# A language is a function build_LANG OUTDIR below, listed in LANGS. The paths of what was
# built are printed last, one a line (the build's own output goes to stderr).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
LANGS="python node go rust java"

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
die() { echo "build-artifacts.sh: $*" >&2; exit 2; }

build_python() { # build_python OUTDIR
    local out=$1 py=${PYTHON:-python3} scratch=""
    export PIP_CONSTRAINT=$ROOT/clients/python/constraints.txt PIP_DISABLE_PIP_VERSION_CHECK=1
    if ! "$py" -c 'import build' 2>/dev/null; then
        scratch=$(mktemp -d)
        "$py" -m venv "$scratch/venv"
        "$scratch/venv/bin/pip" install -q build >&2
        py=$scratch/venv/bin/python
    fi
    "$py" -m build --outdir "$out" "$ROOT/clients/python" >&2
    [ -z "$scratch" ] || rm -rf "$scratch"
    ls "$out"/*.whl "$out"/*.tar.gz
}

build_node() { # build_node OUTDIR
    local out=$1
    (cd "$ROOT/clients/node" && npm pack --pack-destination "$out" --loglevel=warn >&2)
    ls "$out"/*.tgz
}

build_go() { # build_go OUTDIR
    local out=$1 src=$ROOT/clients/go module version scratch file
    export PATH="$PATH:/usr/local/go/bin"
    command -v go >/dev/null || die "go: no Go toolchain here (go is not on PATH)"
    module=$(cd "$src" && go list -m)
    version=$(sed -n 's/^const Version = "\([0-9][0-9.]*\)"$/\1/p' "$src/version.go")
    [ -n "$version" ] || die "no 'const Version = \"X.Y.Z\"' in clients/go/version.go"
    if (cd "$src" && go mod edit -json) | grep -qE '"Replace": \['; then
        die "clients/go/go.mod has replace directives: a published module must not"
    fi
    (cd "$src" && go mod download && go mod verify) >&2
    scratch=$(mktemp -d)
    # shellcheck disable=SC2064 # the folder is known now
    trap "chmod -R u+w '$scratch' 2>/dev/null; rm -rf '$scratch'" RETURN
    mkdir "$scratch/repo"
    (cd "$ROOT" && git ls-files --cached --others --exclude-standard -z -- clients/go) |
        while IFS= read -r -d '' file; do
            [ -f "$ROOT/$file" ] || continue # deleted, not yet committed
            mkdir -p "$scratch/repo/$(dirname "${file#clients/go/}")"
            cp "$ROOT/$file" "$scratch/repo/${file#clients/go/}"
        done
    (
        cd "$scratch/repo"
        git init -q
        git add -A
        git -c user.name=build-artifacts -c user.email=build-artifacts@localhost commit -qm "$module v$version"
        git tag "v$version"
    ) >&2
    # The go command fetches the tag from the repository as from the module's home (git's
    # insteadOf), with a module cache of its own, and writes the files the proxy serves.
    (
        cd "$scratch"
        GOMODCACHE=$scratch/modcache GOPROXY=direct GOPRIVATE=$module GOFLAGS=-mod=mod \
            GIT_CONFIG_COUNT=2 \
            GIT_CONFIG_KEY_0="url.file://$scratch/repo.insteadOf" GIT_CONFIG_VALUE_0="https://$module" \
            GIT_CONFIG_KEY_1=protocol.file.allow GIT_CONFIG_VALUE_1=always \
            go mod download -json "$module@v$version"
    ) >&2
    mkdir -p "$out/$module/@v"
    for file in info mod zip; do
        cp "$scratch/modcache/cache/download/$module/@v/v$version.$file" "$out/$module/@v/"
    done
    echo "v$version" >"$out/$module/@v/list"
    if grep -qE '^[[:space:]]*replace([[:space:]]|\()' "$out/$module/@v/v$version.mod"; then
        die "the module's go.mod as served has replace directives"
    fi
    ls "$out/$module/@v/list" "$out/$module/@v/v$version".*
}

build_rust() { # build_rust OUTDIR
    local out=$1 target=${CARGO_TARGET_DIR:-$ROOT/target/clients}
    rm -f "$target"/package/pg-idempotency-*.crate
    PATH="$HOME/.cargo/bin:$PATH" cargo package --locked --allow-dirty \
        --manifest-path "$ROOT/clients/rust/Cargo.toml" --target-dir "$target" >&2
    cp "$target"/package/pg-idempotency-*.crate "$out"/
    ls "$out"/*.crate
}

build_java() { # build_java OUTDIR
    local out=$1 scratch version m artifact cp resources
    scratch=$(mktemp -d)
    tar -C "$ROOT/clients/java" --exclude=./target --exclude='./*/target' -cf - . | tar -C "$scratch" -xf -
    # The modules' compile class paths (provided included) are javadoc's.
    mvn -B -q -ntp -f "$scratch/pom.xml" -pl core,servlet,spring-boot-starter -am -DskipTests package \
        dependency:build-classpath -Dmdep.includeScope=compile -Dmdep.outputFile=target/compile-classpath.txt >&2
    version=$(/usr/bin/python3 -c 'import sys, xml.etree.ElementTree as E
print(E.parse(sys.argv[1]).getroot().find("{http://maven.apache.org/POM/4.0.0}version").text)' "$scratch/pom.xml")
    cp "$scratch/pom.xml" "$out/pg-idempotency-parent-$version.pom"
    for m in core servlet spring-boot-starter; do
        artifact=pg-idempotency-$m-$version
        cp "$scratch/$m/target/$artifact.jar" "$out/"
        cp "$scratch/$m/pom.xml" "$out/$artifact.pom"
        resources=()
        [ -d "$scratch/$m/src/main/resources" ] && resources=(-C "$scratch/$m/src/main/resources" .)
        jar --create --file "$out/$artifact-sources.jar" -C "$scratch/$m/src/main/java" . "${resources[@]}"
        cp=$(cat "$scratch/$m/target/compile-classpath.txt")
        javadoc -quiet -Xdoclint:all,-missing -Werror -d "$scratch/$m/target/apidocs" -sourcepath "$scratch/$m/src/main/java" \
            -subpackages dev.pgidempotency -classpath "$cp" >&2
        jar --create --file "$out/$artifact-javadoc.jar" -C "$scratch/$m/target/apidocs" .
    done
    rm -rf "$scratch"
    ls "$out"/*.pom "$out"/*.jar
}

case ${1:-} in
    -h|--help) usage; exit 0 ;;
    --list) tr ' ' '\n' <<<"$LANGS"; exit 0 ;;
    "") usage >&2; exit 2 ;;
esac
lang=$1
[[ " $LANGS " == *" $lang "* ]] || die "unknown language '$lang' (known: $LANGS)"
out=$(realpath -m "${2:-$ROOT/target/artifacts/$lang}")
rm -rf "$out"
mkdir -p "$out"
"build_$lang" "$out"
