#!/usr/bin/env bash
# A throwaway PostgreSQL cluster owned by the postgres OS user (PostgreSQL will not run
# as root), on a private port and socket directory. The logic lives in tests/lib.sh.
#   scripts/cluster.sh [--pg MAJOR] start DIR PORT [postgresql.conf lines...]   initdb if needed, start
#   scripts/cluster.sh [--pg MAJOR] stop DIR
# MAJOR: 15 (default, or $PG_MAJOR) or 18. Clients connect with: psql -h DIR/socket -p PORT -U postgres
# (the unix socket only; the extra line "listen_addresses = '127.0.0.1'" opens 127.0.0.1:PORT too).
set -euo pipefail
if [ "${1:-}" = --pg ]; then
    PG_MAJOR=${2:?--pg needs a major (15 or 18)}
    shift 2
fi
. "$(dirname "$0")/../tests/lib.sh" || exit 2

case ${1:-} in
start) cluster_start "${2:?cluster directory}" "${3:?port}" "${@:4}" ;;
stop) cluster_stop "${2:?cluster directory}" ;;
*)
    echo "usage: $0 [--pg MAJOR] start DIR PORT [conf lines] | stop DIR" >&2
    exit 2
    ;;
esac
