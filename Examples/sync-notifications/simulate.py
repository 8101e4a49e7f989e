"""Changes notes now and then, as the rest of an application would: new notes, edits, deletions, and notes handed
over to another user (an UPDATE of owner_id, which the relay sends as "left" to the old owner and "joined" to the
new one).

  python3 simulate.py [--every SECONDS] [--count N]
"""

import argparse
import os
import random
import time

import psycopg

USERS = ["alice", "bob", "carol"]
BODIES = ["Book the dentist", "Renew the passport", "Buy oat milk", "Fix the bike light", "Send the invoice",
          "Plan the offsite", "Reply to Grace", "Back up the laptop", "Order a new chair", "Read the RFC"]
EDITS = ["(done)", "(tomorrow)", "(urgent)", "(waiting)", "(half done)"]


def step(conn):
    """One change, in its own transaction; returns a line saying what it did."""
    rows = conn.execute("SELECT id, owner_id, body FROM public.notes ORDER BY id").fetchall()
    roll = random.random()
    if len(rows) < 3 or roll < 0.35:
        owner, body = random.choice(USERS), random.choice(BODIES)
        (note,) = conn.execute("INSERT INTO public.notes (owner_id, body) VALUES (%s, %s) RETURNING id",
                               (owner, body)).fetchone()
        return f"insert #{note} for {owner}"
    note, owner, body = random.choice(rows)
    if roll < 0.65:
        body = body.split(" (")[0] + " " + random.choice(EDITS)
        conn.execute("UPDATE public.notes SET body = %s, updated_at = now() WHERE id = %s", (body, note))
        return f"update #{note} of {owner}"
    if roll < 0.85:
        new_owner = random.choice([u for u in USERS if u != owner])
        conn.execute("UPDATE public.notes SET owner_id = %s, updated_at = now() WHERE id = %s", (new_owner, note))
        return f"move #{note} from {owner} to {new_owner}"
    conn.execute("DELETE FROM public.notes WHERE id = %s", (note,))
    return f"delete #{note} of {owner}"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--every", type=float, default=2.0)
    parser.add_argument("--count", type=int, default=0, help="stop after N changes (0: never)")
    args = parser.parse_args()
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        done = 0
        while args.count == 0 or done < args.count:
            time.sleep(args.every)
            print(f"simulate: {step(conn)}", flush=True)
            done += 1
    print(f"simulate: done, {done} changes", flush=True)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        pass
