#!/usr/bin/env bash
# The Java package as Maven Central will ship it (issue 33), used the way its README says:
#   1. the README's install block run as it is, from a folder holding the clone as idempotency/:
#      scripts/build-artifacts.sh java (each module's jar with its -sources and -javadoc jars and
#      its pom, and the parent pom), then `mvn install:install-file` of each. Every `mvn` here
#      runs with a throwaway local repository (a `mvn` first on PATH adds -Dmaven.repo.local),
#      never ~/.m2, which may hold a `mvn install` of the clone; that repository starts as a copy
#      of ~/.m2's third-party artifacts (what the java-client suite fetched), so only Maven's
#      install plugin is downloaded
#   2. two fresh projects in a temp folder, outside the clone: their poms are
#      tests/artifacts/java/{spring,servlet}.pom.xml with the README's dependency blocks put in,
#      the README's example apps copied in (OrdersApplication.java, OrdersServer.java: the
#      README shows these files, ReadmeTest checks it); `mvn compile dependency:build-classpath`;
#      the package's jars on the class path are the built ones, from the throwaway repository
#   3. each app started as the README says against a throwaway PostgreSQL 15 cluster with the
#      extension: a fresh request (201), the same again (replayed, the same bytes), the same key
#      with another body (422 problem), the database restarted under the idle app (the next
#      request 201), stopped (503 problem+json with Retry-After, within 2 s), started again (the
#      key refused meanwhile 201, once); nothing unhandled in the app's log
# Ports: tests/lib.sh's "artifacts-java" row (PostgreSQL +0, the example app +1); its folder
# dir_of artifacts-java. Needs the extension installed into PostgreSQL 15, and Maven Central.
# Last line: "artifacts-java: N passed, M failed".
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
. "$root/tests/lib.sh" || exit 2

port=$(port_of artifacts-java)
app_port=$((port + 1))
dir=$(dir_of artifacts-java)
repo=$dir/m2
real_mvn=$(command -v mvn)

give_up() {
    fail "$1" "$2"
    finish artifacts-java
    exit 1
}

app_pid=""
stop_app() {
    [ -n "$app_pid" ] && kill "$app_pid" 2>/dev/null && wait "$app_pid" 2>/dev/null
    app_pid=""
}
cleanup() {
    stop_app
    cluster_stop "$dir/pg"
}
trap cleanup EXIT

[ -n "$real_mvn" ] || give_up "mvn" "not installed (scripts/install-deps.sh installs Maven)"
extension_installed || give_up "the extension" "not installed into PostgreSQL $PG_MAJOR (cargo pgrx install --release)"
cluster_stop "$dir/pg"
rm -rf "$dir"
mkdir -p "$dir/bin" "$repo" "$dir/home"

# Every mvn below, the README's included, installs into and resolves from $repo.
printf '#!/bin/sh\nexec %q -B -ntp -Dmaven.repo.local=%q "$@"\n' "$real_mvn" "$repo" >"$dir/bin/mvn"
chmod +x "$dir/bin/mvn"
export PATH="$dir/bin:$PATH"
if [ -d "$HOME/.m2/repository" ]; then
    tar -C "$HOME/.m2/repository" --exclude=./dev/pgidempotency -cf - . | tar -C "$repo" -xf -
fi
ln -s "$root" "$dir/home/idempotency"

# readme_block KIND NAME: the fenced block after the README's marker <!-- KIND: NAME ... -->
readme_block() {
    /usr/bin/python3 - "$root/clients/java/README.md" "$1" "$2" <<'PY'
import re, sys
text, kind, name = open(sys.argv[1]).read(), sys.argv[2], sys.argv[3]
m = re.search(r"<!-- " + kind + r": " + re.escape(name) + r"\b[^>]*-->\n```[a-z]*\n(.*?)```\n", text, re.S)
sys.stdout.write(m.group(1) if m else "")
PY
}

echo "== the README's install block, from $dir/home (idempotency/ is the clone)"
install=$(readme_block install tests/artifacts/java.sh)
[ -n "$install" ] || give_up "the README's install block" "not found (<!-- install: tests/artifacts/java.sh ... -->)"
if (cd "$dir/home" && bash -euo pipefail -c "$install") >"$dir/install.log" 2>&1; then
    ok "the README's install block: built and installed into the throwaway repository"
else
    tail -30 "$dir/install.log"
    give_up "the README's install block" "see $dir/install.log"
fi
dist=$dir/home/dist
for m in core servlet spring-boot-starter; do
    for kind in "" -sources -javadoc; do
        f=pg-idempotency-$m-0.1.0$kind.jar
        if [ -f "$dist/$f" ] && cmp -s "$dist/$f" "$repo/dev/pgidempotency/pg-idempotency-$m/0.1.0/$f"; then
            ok "$f built and installed"
        else
            fail "$f" "not built into $dist or not installed as built into $repo"
        fi
    done
done
check "the sources jar holds the sources" "dev/pgidempotency/servlet/IdempotencyFilter.java" \
    "$(unzip -Z1 "$dist/pg-idempotency-servlet-0.1.0-sources.jar" | grep -x dev/pgidempotency/servlet/IdempotencyFilter.java)"
check "the javadoc jar holds the API pages" "dev/pgidempotency/spring/Idempotent.html" \
    "$(unzip -Z1 "$dist/pg-idempotency-spring-boot-starter-0.1.0-javadoc.jar" | grep -x dev/pgidempotency/spring/Idempotent.html)"
check "the starter's jar registers its auto-configuration" "dev.pgidempotency.spring.IdempotencyAutoConfiguration" \
    "$(unzip -p "$dist/pg-idempotency-spring-boot-starter-0.1.0.jar" META-INF/spring/org.springframework.boot.autoconfigure.AutoConfiguration.imports)"

# fresh_project KIND FILE: $dir/KIND with the README's KIND dependencies and the example FILE;
# compiled, its class path in cp.txt
fresh_project() {
    local kind=$1 file=$2 project=$dir/$1
    mkdir -p "$project/src/main/java/example"
    /usr/bin/python3 - "$root/clients/java/pom.xml" "$root/tests/artifacts/java/$kind.pom.xml" \
        "$(readme_block dependencies "$kind")" >"$project/pom.xml" <<'PY' || return 1
import sys, xml.etree.ElementTree as E
ns = {"m": "http://maven.apache.org/POM/4.0.0"}
parent = E.parse(sys.argv[1]).getroot()
def plugin(name):
    for p in parent.iterfind(".//m:pluginManagement/m:plugins/m:plugin", ns):
        if p.find("m:artifactId", ns).text == name:
            return p.find("m:version", ns).text
    raise SystemExit(f"no {name} in {sys.argv[1]}")
deps = sys.argv[3]
if "<dependency>" not in deps:
    raise SystemExit("the README's dependencies block is missing")
text = open(sys.argv[2]).read()
for key, value in {"@SPRING_BOOT_VERSION@": parent.find("m:properties/m:spring-boot.version", ns).text,
                   "@COMPILER_PLUGIN@": plugin("maven-compiler-plugin"),
                   "@RESOURCES_PLUGIN@": plugin("maven-resources-plugin"),
                   "@DEPENDENCY_PLUGIN@": plugin("maven-dependency-plugin"),
                   "@DEPENDENCIES@": "".join("    " + line + "\n" for line in deps.splitlines())}.items():
    text = text.replace(key, value)
sys.stdout.write(text)
PY
    cp "$root/clients/java/examples/src/main/java/example/$file" "$project/src/main/java/example/"
    (cd "$project" && mvn -q compile dependency:build-classpath -Dmdep.outputFile=cp.txt) >"$dir/$kind-build.log" 2>&1
}

echo "== PostgreSQL $PG_MAJOR on port $port"
cluster_fresh "$dir/pg" "$port" "$LISTEN_TCP" || give_up "the cluster" "did not start"
pg_ctl_as() { as_postgres "$PGBIN/pg_ctl" -D "$dir/pg/data" -l "$dir/pg/server.log" -w "$@" >/dev/null; }

# post KEY BODY: POST /orders; sets status, took (seconds), and the files $dir/headers, $dir/body
post() {
    local out
    out=$(curl -sS -o "$dir/body" -D "$dir/headers" -w '%{http_code} %{time_total}' --max-time 30 \
        -H 'Content-Type: application/json' -H 'X-Api-Key: acct_artifacts' -H "Idempotency-Key: \"$1\"" \
        -d "$2" "http://127.0.0.1:$app_port/orders" 2>&1) || out="000 0"
    read -r status took <<<"$out"
}
header() { tr -d '\r' <"$dir/headers" | sed -n "s/^$1: //Ip" | head -1; }
problem_type() { /usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["type"])' "$dir/body" 2>/dev/null; }
is_unavailable() { # the 503 problem with Retry-After
    [ "$status" = 503 ] && [[ $(header content-type) == application/problem+json* ]] &&
        [ "$(problem_type)" = urn:pg-idempotency:problem:service-unavailable ] && [[ $(header retry-after) =~ ^[1-9][0-9]*$ ]]
}
orders() { psql -X -At -h 127.0.0.1 -p "$port" -U postgres -d "$1" -c "SELECT count(*) FROM orders WHERE item = '$2'"; }

run_example() { # run_example KIND MAIN_CLASS ENV...
    local kind=$1 main=$2 db key first log project=$dir/$1
    shift 2
    db=art_$kind
    log=$dir/$kind.log
    fresh_database "$db" -h 127.0.0.1 -p "$port" -U postgres >"$dir/$db.psql.log" 2>&1 ||
        { cat "$dir/$db.psql.log"; fail "$kind: database" "not made"; return; }
    (cd "$project" && exec env "$@" java -cp "target/classes:$(cat cp.txt)" "$main" >"$log" 2>&1) &
    app_pid=$!
    for _ in $(seq 300); do
        curl -s -o /dev/null "http://127.0.0.1:$app_port/" && break
        kill -0 "$app_pid" 2>/dev/null || break
        sleep 0.2
    done
    key=k-$RANDOM-$RANDOM
    post "$key" "{\"item\": \"book-$key\", \"quantity\": 1}"
    check "$kind: a fresh request" 201 "$status"
    first=$(cat "$dir/body")
    post "$key" "{\"item\": \"book-$key\", \"quantity\": 1}"
    check "$kind: the same request again, replayed" "201 true $first" "$status $(header idempotent-replayed) $(cat "$dir/body")"
    post "$key" '{"item": "pen", "quantity": 1}'
    check "$kind: the same key with another body" "422 urn:pg-idempotency:problem:idempotency-key-reused" "$status $(problem_type)"
    check "$kind: one order" 1 "$(orders "$db" "book-$key")"

    pg_ctl_as -m fast restart
    key=k-$RANDOM-$RANDOM
    post "$key" "{\"item\": \"lamp-$key\", \"quantity\": 1}"
    check "$kind: the database restarted under the idle app, the next request" 201 "$status"

    pg_ctl_as -m fast stop
    key=k-$RANDOM-$RANDOM
    post "$key" "{\"item\": \"cup-$key\", \"quantity\": 2}"
    if is_unavailable && awk -v t="$took" 'BEGIN { exit !(t < 2) }'; then
        ok "$kind: the database stopped: 503 problem+json, Retry-After $(header retry-after), in $took s"
    else
        fail "$kind: the database stopped" "expected 503 problem+json with Retry-After within 2 s, got $status in $took s: $(head -c 300 "$dir/body")"
    fi
    pg_ctl_as start
    for _ in $(seq 30); do
        post "$key" "{\"item\": \"cup-$key\", \"quantity\": 2}"
        [ "$status" = 503 ] || break
        sleep "$(header retry-after)"
    done
    check "$kind: started again, the key refused meanwhile" "201 " "$status $(header idempotent-replayed)"
    check "$kind: its one order" 1 "$(orders "$db" "cup-$key")"
    check "$kind: nothing unhandled in the app's log" "" \
        "$(grep -E 'Servlet\.service\(\)|database error|the handler failed' "$log" | head -3)"
    stop_app
}

echo "== the README's Spring Boot app in a fresh project: $dir/spring"
if fresh_project spring OrdersApplication.java; then
    ok "spring: the README's dependencies and OrdersApplication.java compile in a fresh project"
    check "spring: the package's jars come from the throwaway repository" \
        "$repo/dev/pgidempotency/pg-idempotency-spring-boot-starter/0.1.0/pg-idempotency-spring-boot-starter-0.1.0.jar" \
        "$(tr ':' '\n' <"$dir/spring/cp.txt" | grep pg-idempotency-spring-boot-starter)"
    run_example spring example.OrdersApplication \
        SPRING_DATASOURCE_URL="jdbc:postgresql://127.0.0.1:$port/art_spring?user=postgres" \
        SERVER_PORT="$app_port" SERVER_ADDRESS=127.0.0.1
else
    tail -30 "$dir/spring-build.log"
    fail "spring: the fresh project" "did not build; see $dir/spring-build.log"
fi

echo "== the README's Servlet app in a fresh project: $dir/servlet"
if fresh_project servlet OrdersServer.java; then
    ok "servlet: the README's dependencies and OrdersServer.java compile in a fresh project"
    check "servlet: the package's jars come from the throwaway repository" \
        "$repo/dev/pgidempotency/pg-idempotency-servlet/0.1.0/pg-idempotency-servlet-0.1.0.jar" \
        "$(tr ':' '\n' <"$dir/servlet/cp.txt" | grep pg-idempotency-servlet)"
    run_example servlet example.OrdersServer \
        DATABASE_URL="postgresql://postgres@127.0.0.1:$port/art_servlet" PORT="$app_port"
else
    tail -30 "$dir/servlet-build.log"
    fail "servlet: the fresh project" "did not build; see $dir/servlet-build.log"
fi

finish artifacts-java
