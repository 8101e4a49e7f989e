"""Changes rows now and then, as the rest of an application would: new orders, status updates, deletions.

  python3 simulate.py [--every SECONDS] [--count N]
"""

import argparse
import os
import random
import time

import psycopg

CUSTOMERS = ["Ada", "Grace", "Linus", "Barbara", "Ken", "Margaret", "Dennis", "Frances"]
ITEMS = ["Keyboard", "Monitor", "Laptop", "Mouse", "Dock", "Headset", "Webcam", "Chair"]
NEXT = {"new": "packing", "packing": "shipped", "shipped": "delivered"}


def step(conn):
    rows = conn.execute("SELECT id, status FROM orders ORDER BY id").fetchall()
    movable = [(i, s) for i, s in rows if s in NEXT]
    roll = random.random()
    if not rows or roll < 0.4:
        conn.execute("INSERT INTO orders (customer, item) VALUES (%s, %s)",
                     (random.choice(CUSTOMERS), random.choice(ITEMS)))
    elif movable and roll < 0.9:
        order, status = random.choice(movable)
        conn.execute("UPDATE orders SET status = %s, updated_at = now() WHERE id = %s", (NEXT[status], order))
    else:
        conn.execute("DELETE FROM orders WHERE id = %s", (random.choice(rows)[0],))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--every", type=float, default=2.0)
    parser.add_argument("--count", type=int, default=0, help="stop after N changes (0: never)")
    args = parser.parse_args()
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        done = 0
        while args.count == 0 or done < args.count:
            time.sleep(args.every)
            step(conn)
            done += 1


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        pass
