#!/usr/bin/env bash
# Runs the example: the broker on $BROKER_PORT (9292) with a secret, and the web app on $PORT (8000).
# Open http://localhost:8000/ and press "Start a job". Ctrl-C stops both.
set -euo pipefail
cd "$(dirname "$0")"

export PORT="${PORT:-8000}"
export BROKER_PORT="${BROKER_PORT:-9292}"
export BROKER_URL="http://localhost:$BROKER_PORT/faye"
# The secret signs subscriptions (in the app) and authorizes publishes (in the worker). Keep it off the browser.
export PUBSUB_SECRET="${PUBSUB_SECRET:-$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')}"
export PUBSUB="${PUBSUB:-$(command -v pubsub || echo ../../.build/debug/pubsub)}"

"$PUBSUB" serve --host 127.0.0.1 --port "$BROKER_PORT" --signature-expiration 3600 &
broker=$!
trap 'kill $broker 2>/dev/null; wait $broker 2>/dev/null' EXIT
trap 'exit 130' INT TERM

python3 app.py
