#!/usr/bin/env bash
# Runs the example: PostgreSQL (a throwaway cluster unless DATABASE_URL is set), the broker on $BROKER_PORT
# (9292), the NOTIFY listener, a script that changes rows every $EVERY (2) seconds ($CHANGES times, 0: forever),
# and the page on $PORT (8001).
# Open http://localhost:8001/ and watch the table follow the database. Ctrl-C stops everything.
set -euo pipefail
cd "$(dirname "$0")"

export PORT="${PORT:-8001}"
export BROKER_PORT="${BROKER_PORT:-9292}"
export BROKER_URL="http://localhost:$BROKER_PORT/faye"
export PUBSUB="${PUBSUB:-$(command -v pubsub || echo ../../.build/debug/pubsub)}"
python3 -c 'import psycopg' 2>/dev/null || { echo "run.sh: needs psycopg: pip install 'psycopg[binary]'" >&2; exit 1; }

pids=()
pgdir=""
as_postgres=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ -n "$pgdir" ]; then
    "${as_postgres[@]}" "$PGBIN/pg_ctl" -D "$pgdir/data" -m fast -w stop >/dev/null 2>&1 || true
    rm -rf "$pgdir"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [ -z "${DATABASE_URL:-}" ]; then
  # A throwaway cluster in a temporary folder, reachable on a Unix socket only.
  PGBIN="${PGBIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)}"
  [ -x "$PGBIN/initdb" ] || { echo "run.sh: PostgreSQL not found: apt-get install postgresql, or set DATABASE_URL" >&2; exit 1; }
  pgdir="$(mktemp -d /tmp/pubsub-sync-XXXXXX)"
  if [ "$(id -u)" -eq 0 ]; then chown postgres "$pgdir"; as_postgres=(runuser -u postgres --); fi
  "${as_postgres[@]}" "$PGBIN/initdb" -D "$pgdir/data" -U postgres -A trust >/dev/null
  "${as_postgres[@]}" "$PGBIN/pg_ctl" -D "$pgdir/data" -l "$pgdir/log" -w \
    -o "-k $pgdir -c listen_addresses=''" start >/dev/null
  export DATABASE_URL="postgresql://postgres@/postgres?host=$pgdir"
fi
psql "$DATABASE_URL" -q -v ON_ERROR_STOP=1 -f schema.sql >/dev/null

"$PUBSUB" serve --host 127.0.0.1 --port "$BROKER_PORT" & pids+=($!)
python3 listen.py & pids+=($!)
python3 simulate.py --every "${EVERY:-2}" --count "${CHANGES:-0}" & pids+=($!)
python3 app.py & app=$!
pids+=("$app")
wait "$app"
