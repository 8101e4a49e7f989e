#!/usr/bin/env bash
# A background job: reports its progress, then its result, on the job's own channel with `pubsub publish`.
# The broker accepts the publishes because they carry the secret (PUBSUB_SECRET, set by run.sh).
#
#   worker.sh JOB_ID
set -euo pipefail
job="$1"
channel="/jobs/$job"
step_seconds="${STEP_SECONDS:-0.6}"

publish() { "$PUBSUB" publish --url "$BROKER_URL" "$channel" "$1" >/dev/null; }

steps=("Reading orders" "Matching payments" "Computing totals" "Rendering charts" "Writing the PDF")
total=${#steps[@]}
for i in "${!steps[@]}"; do
  publish "{\"progress\": $(( i * 100 / total )), \"step\": \"${steps[$i]}\"}"
  sleep "$step_seconds"
done
orders=$(( (RANDOM % 900) + 100 ))
publish "{\"progress\": 100, \"done\": true, \"result\": {\"orders\": $orders, \"report\": \"/reports/$job.pdf\"}}"
