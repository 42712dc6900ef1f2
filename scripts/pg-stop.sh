#!/usr/bin/env bash
# Stops the PostgreSQL that scripts/pg-start.sh started in DIR.
set -euo pipefail
dir=${1:?usage: pg-stop.sh DIR}
[ -d "$dir" ] || exit 0
dir=$(cd "$dir" && pwd)
cd / # the server's user may not be allowed into the caller's folder
bindir=${PG_BINDIR:-}
if [ -z "$bindir" ]; then
  for d in /usr/lib/postgresql/*/bin; do [ -x "$d/pg_ctl" ] && bindir=$d; done
fi
[ -f "$dir/data/postmaster.pid" ] || exit 0
if [ "$(id -u)" = 0 ]; then
  runuser -u postgres -- "$bindir/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null
else
  "$bindir/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null
fi
