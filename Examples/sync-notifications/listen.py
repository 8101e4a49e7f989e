"""LISTENs for the trigger's notifications and publishes each change with `pubsub publish`.

A stand-in for `pubsub relay postgres` (see the README): NOTIFY is fire and forget, so changes made while this
script is down are not published; the relay reads the replication feed instead and resumes exactly.
"""

import json
import os
import subprocess
import sys

import psycopg

DATABASE_URL = os.environ["DATABASE_URL"]
BROKER_URL = os.environ.get("BROKER_URL", "http://localhost:9292/faye")
PUBSUB = os.environ.get("PUBSUB", "pubsub")


def publish(change):
    # The channel layout of `pubsub relay`: /changes/<schema>/<table>/<id>.
    channel = f"/changes/public/orders/{change['id']}"
    subprocess.run([PUBSUB, "publish", "--url", BROKER_URL, channel, json.dumps(change)],
                   check=False, stdout=subprocess.DEVNULL, timeout=30)


def main():
    with psycopg.connect(DATABASE_URL, autocommit=True) as conn:
        conn.execute("LISTEN orders_changes")
        print("listen: waiting for changes to public.orders", flush=True)
        for note in conn.notifies():
            publish(json.loads(note.payload))


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        sys.exit(0)
