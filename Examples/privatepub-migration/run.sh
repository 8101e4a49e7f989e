#!/usr/bin/env bash
# Runs the example: the broker configured by config/private_pub.yml (in place of `rackup private_pub.ru`)
# and the app on $PORT (3000). Open http://localhost:3000/ in two windows and chat. Ctrl-C stops both.
set -euo pipefail
cd "$(dirname "$0")"

export PORT="${PORT:-3000}"
export RAILS_ENV="${RAILS_ENV:-development}"
export PRIVATE_PUB_CONFIG="${PRIVATE_PUB_CONFIG:-config/private_pub.yml}"
PUBSUB="${PUBSUB:-$(command -v pubsub || echo ../../.build/debug/pubsub)}"

# Before: rackup private_pub.ru -s thin -E production
"$PUBSUB" serve --privatepub-config "$PRIVATE_PUB_CONFIG" --port "$(python3 app.py --broker-port)" &
broker=$!
trap 'kill $broker 2>/dev/null; wait $broker 2>/dev/null' EXIT
trap 'exit 130' INT TERM

python3 app.py
