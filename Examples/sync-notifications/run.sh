#!/usr/bin/env bash
# Runs the example: PostgreSQL (a throwaway cluster with wal_level=logical unless DATABASE_URL is set), the broker
# on $BROKER_PORT (9292) with JWT authorization, the relay (the WAL of public.notes to /users/<owner_id>/notes), a
# script that changes notes every $EVERY (2) seconds ($CHANGES times, 0: forever), and the app on $PORT (8001).
# Open http://localhost:8001/?user=alice and http://localhost:8001/?user=bob side by side. Ctrl-C stops everything.
set -euo pipefail
cd "$(dirname "$0")"

export PORT="${PORT:-8001}"
export BROKER_PORT="${BROKER_PORT:-9292}"
export BROKER_URL="http://localhost:$BROKER_PORT/faye"
# The JWT key is shared by the app (which signs the pages' and the relay's tokens) and the broker (which verifies).
export PUBSUB_JWT_KEY="${PUBSUB_JWT_KEY:-$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')}"
export PUBSUB="${PUBSUB:-$(command -v pubsub || echo ../../.build/debug/pubsub)}"
SLOT="${SLOT:-sync_notes}"
python3 -c 'import psycopg' 2>/dev/null || { echo "run.sh: needs psycopg: pip install 'psycopg[binary]'" >&2; exit 1; }

pids=()
state="$(mktemp -d /tmp/pubsub-sync-XXXXXX)"   # the relay's checkpoint, and the throwaway cluster if any
own_cluster=""
as_postgres=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ -n "$own_cluster" ]; then
    "${as_postgres[@]}" "$PGBIN/pg_ctl" -D "$state/data" -m fast -w stop >/dev/null 2>&1 || true
  elif [ -n "${DATABASE_URL:-}" ]; then
    # A slot nobody reads keeps WAL on the server for ever: this run's checkpoint goes, so its slot goes too.
    psql "$DATABASE_URL" -qAt -c "SELECT pg_drop_replication_slot('$SLOT') FROM pg_replication_slots
                                  WHERE slot_name = '$SLOT'" >/dev/null 2>&1 || true
    # And the publication the relay made for it (pgoutput, the default plugin: pubsub_<slot>).
    psql "$DATABASE_URL" -qAt -c "DROP PUBLICATION IF EXISTS pubsub_$SLOT" >/dev/null 2>&1 || true
  fi
  rm -rf "$state"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# until_ok SECONDS PID WHAT COMMAND…: runs COMMAND every 0.2 s until it succeeds; gives up (exit 1) after SECONDS,
# or as soon as process PID has exited.
until_ok() {
  local tries=$(($1 * 5)) pid=$2 what=$3
  shift 3
  until "$@" >/dev/null 2>&1; do
    kill -0 "$pid" 2>/dev/null || { echo "run.sh: $what: it exited (see above)" >&2; exit 1; }
    tries=$((tries - 1))
    [ "$tries" -gt 0 ] || { echo "run.sh: $what" >&2; exit 1; }
    sleep 0.2
  done
}

if [ -z "${DATABASE_URL:-}" ]; then
  # A throwaway cluster in the temporary folder, reachable on a Unix socket only, with logical decoding on.
  PGBIN="${PGBIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)}"
  [ -x "$PGBIN/initdb" ] || { echo "run.sh: PostgreSQL not found: apt-get install postgresql, or set DATABASE_URL" >&2; exit 1; }
  own_cluster=1
  if [ "$(id -u)" -eq 0 ]; then chown postgres "$state"; as_postgres=(runuser -u postgres --); fi
  "${as_postgres[@]}" "$PGBIN/initdb" -D "$state/data" -U postgres -A trust >/dev/null
  "${as_postgres[@]}" "$PGBIN/pg_ctl" -D "$state/data" -l "$state/log" -w \
    -o "-k $state -c listen_addresses='' -c wal_level=logical" start >/dev/null
  export DATABASE_URL="postgresql://postgres@/postgres?host=$state"
  echo "sync-notifications: database $DATABASE_URL"
else
  [ "$(psql "$DATABASE_URL" -qAt -c 'SHOW wal_level')" = logical ] || {
    echo "run.sh: the relay needs wal_level = logical on that server" >&2; exit 1; }
fi
psql "$DATABASE_URL" -q -v ON_ERROR_STOP=1 -f schema.sql >/dev/null

# JWT authorization: the broker verifies tokens with PUBSUB_JWT_KEY (the environment's --jwt-key).
"$PUBSUB" serve --host 127.0.0.1 --port "$BROKER_PORT" \
  --allowed-origins "http://localhost:$PORT,http://127.0.0.1:$PORT" --disable-callback-polling & broker=$!
pids+=("$broker")
until_ok 20 "$broker" "the broker did not start on port $BROKER_PORT" bash -c "exec 3<>/dev/tcp/127.0.0.1/$BROKER_PORT"

# The relay: every committed change of public.notes, read from the WAL, goes to the channel of the row's owner.
# Its token (app.py relay-token) grants publishing only: to /users/** and to the table's truncate channel.
relay_token="$(python3 app.py relay-token)"
"$PUBSUB" relay postgres --dsn "$DATABASE_URL" --slot "$SLOT" --table public.notes --include-doc \
  --route 'public.notes=/users/{owner_id}/notes' --checkpoint "$state/relay.checkpoint" \
  --url "http://127.0.0.1:$BROKER_PORT/faye" --token "$relay_token" & relay=$!
pids+=("$relay")
# The slot marks where the feed starts: changes made before the relay created it would never be relayed.
slot_ready() {
  [ "$(psql "$DATABASE_URL" -qAt -c "SELECT count(*) FROM pg_replication_slots WHERE slot_name = '$SLOT'")" = 1 ]
}
until_ok 30 "$relay" "the relay did not create its slot $SLOT" slot_ready

python3 simulate.py --every "${EVERY:-2}" --count "${CHANGES:-0}" & pids+=($!)
python3 app.py & app=$!
pids+=("$app")
wait "$app"
