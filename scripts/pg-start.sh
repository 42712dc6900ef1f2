#!/usr/bin/env bash
# Starts a throwaway PostgreSQL for tests and prints its URL on the last line.
#   scripts/pg-start.sh DIR      # data, socket and log under DIR
#   scripts/pg-stop.sh DIR       # stops it
# initdb refuses to run as root, so as root the server runs as user postgres.
set -euo pipefail
dir=${1:?usage: pg-start.sh DIR}
mkdir -p "$dir" && dir=$(cd "$dir" && pwd)
cd / # the server's user may not be allowed into the caller's folder
# The default lies below Linux's ephemeral range (32768-60999), where no
# outgoing connection or listener on port 0 can hold it.
port=${PDPLANE_TEST_PG_PORT:-25432}
fixed= # a restart keeps the port its clients know
[ -f "$dir/port" ] && port=$(cat "$dir/port") && fixed=1

bindir=${PG_BINDIR:-}
if [ -z "$bindir" ]; then
  for d in /usr/lib/postgresql/*/bin; do [ -x "$d/initdb" ] && bindir=$d; done
fi
if [ -z "$bindir" ] && command -v initdb >/dev/null; then bindir=$(dirname "$(command -v initdb)"); fi
if [ -z "$bindir" ]; then
  echo "pg-start: PostgreSQL server binaries not found; install them (apt-get install postgresql) or set PDPLANE_TEST_DATABASE_URL" >&2
  exit 1
fi

as_pg() {
  if [ "$(id -u)" = 0 ]; then
    # runuser keeps the environment small and needs no password.
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

mkdir -p "$dir"
[ "$(id -u)" = 0 ] && chown postgres "$dir"
if [ ! -f "$dir/data/PG_VERSION" ]; then
  as_pg "$bindir/initdb" -D "$dir/data" -U postgres --auth=trust -E UTF8 >"$dir/initdb.log" 2>&1 ||
    { cat "$dir/initdb.log" >&2; exit 1; }
fi
if ! as_pg "$bindir/pg_ctl" -D "$dir/data" status >/dev/null 2>&1; then
  # Another server (a developer's own, a parallel run) may hold the port.
  # A port may also be held by a socket that is not listening (an outgoing
  # connection's), which only a failed bind shows: then the next port.
  for try in $(seq 1 20); do
    while (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do port=$((port + 1)); done
    echo "$port" >"$dir/port"
    [ -f "$dir/server.log" ] && : >"$dir/server.log"
    if as_pg "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 start \
      -o "-p $port -k $dir -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=300" >/dev/null 2>&1; then
      break
    fi
    if [ -n "$fixed" ] || [ "$try" = 20 ] || ! grep -q 'Address already in use' "$dir/server.log"; then
      cat "$dir/server.log" >&2
      exit 1
    fi
    port=$((port + 1))
  done
fi
as_pg "$bindir/psql" -h 127.0.0.1 -p "$port" -U postgres -d postgres -Atqc \
  "SELECT 1 FROM pg_database WHERE datname = 'pdplane_test'" | grep -q 1 ||
  as_pg "$bindir/createdb" -h 127.0.0.1 -p "$port" -U postgres pdplane_test
echo "postgres://postgres@127.0.0.1:$port/pdplane_test?sslmode=disable"
