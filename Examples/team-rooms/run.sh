#!/usr/bin/env bash
# Runs the example: the broker on $BROKER_PORT (9292) with JWT and the app's hook, and the app on $PORT (8000).
# Open http://localhost:8000/?user=alice and, in another window, http://localhost:8000/?user=bob. Ctrl-C stops both.
set -euo pipefail
cd "$(dirname "$0")"

export PORT="${PORT:-8000}"
export BROKER_PORT="${BROKER_PORT:-9292}"
export BROKER_URL="http://localhost:$BROKER_PORT/faye"
# The JWT key is shared by the app (which signs) and the broker (which verifies). Keep it off the browser.
export PUBSUB_JWT_KEY="${PUBSUB_JWT_KEY:-$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')}"
export PUBSUB="${PUBSUB:-$(command -v pubsub || echo ../../.build/debug/pubsub)}"

"$PUBSUB" serve --host 127.0.0.1 --port "$BROKER_PORT" \
  --auth-hook "http://127.0.0.1:$PORT/pubsub/authorize" \
  --allowed-origins "http://localhost:$PORT,http://127.0.0.1:$PORT" --disable-callback-polling &
broker=$!
trap 'kill $broker 2>/dev/null; wait $broker 2>/dev/null' EXIT
trap 'exit 130' INT TERM

python3 app.py
