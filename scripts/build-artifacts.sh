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
LANGS="python java"

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
