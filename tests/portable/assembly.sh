#!/usr/bin/env bash
# The portable edition is assembled, not hand-kept (scripts/assemble_portable.py): the
# assembler's unit tests (tests/portable/test_assemble.py), then the committed release file
# of Cargo.toml's version and sql/portable/pgtle.sql against what the assembler makes from
# their sources, which also checks that every statement of the shared DDL is in the
# portable edition or named native-only, and every file of sql/portable/functions is used.
# No build, no server: seconds.
#   tests/portable/assembly.sh
# Last line: "portable-assembly: N passed, M failed".
set -uo pipefail
. "$(dirname "$0")/../lib.sh" || exit 2
cd "$ROOT" || exit 2

units=$(/usr/bin/python3 -m unittest -v tests/portable/test_assemble.py 2>&1)
while read -r name verdict; do
    if [ "$verdict" = ok ]; then ok "unit: $name"; else fail "unit: $name" "$verdict"; fi
done < <(sed -nE 's/^(test_[a-z_]+) \(.*\) \.\.\. (.*)$/\1 \2/p' <<<"$units")
grep -qE '^Ran [1-9][0-9]* tests?' <<<"$units" || fail "unit: did not run" "$(tail -n 5 <<<"$units")"
grep -qx OK <<<"$units" || echo "$units" | sed -n '/^=====/,$p' | head -40

version=$(extension_version)
for what in release pgtle; do
    case $what in
    release) file=sql/portable/idempotency-portable--$version.sql ;;
    pgtle) file=sql/portable/pgtle.sql ;;
    esac
    assemble=(/usr/bin/python3 scripts/assemble_portable.py --print "$what")
    if ! error=$("${assemble[@]}" 2>&1 >/dev/null); then
        fail "$file is what scripts/assemble_portable.py assembles" "$error"; continue
    fi
    check "$file is what scripts/assemble_portable.py assembles" "" \
        "$(diff "$file" <("${assemble[@]}") | head -40)"
done

finish portable-assembly
