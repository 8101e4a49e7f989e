-- The table the page mirrors, and a trigger that announces every change with NOTIFY.
CREATE TABLE IF NOT EXISTS orders (
  id         serial PRIMARY KEY,
  customer   text NOT NULL,
  item       text NOT NULL,
  status     text NOT NULL DEFAULT 'new',
  updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE OR REPLACE FUNCTION orders_notify() RETURNS trigger AS $$
DECLARE
  changed orders;
BEGIN
  IF TG_OP = 'DELETE' THEN changed := OLD; ELSE changed := NEW; END IF;
  PERFORM pg_notify('orders_changes', json_build_object(
    'op', lower(TG_OP),
    'id', changed.id,
    'row', CASE WHEN TG_OP = 'DELETE' THEN NULL ELSE row_to_json(changed) END
  )::text);
  RETURN NULL;
END;
$$ LANGUAGE plpgsql;

DROP TRIGGER IF EXISTS orders_notify ON orders;
CREATE TRIGGER orders_notify AFTER INSERT OR UPDATE OR DELETE ON orders
  FOR EACH ROW EXECUTE FUNCTION orders_notify();

INSERT INTO orders (customer, item, status)
SELECT * FROM (VALUES ('Ada', 'Keyboard', 'shipped'), ('Grace', 'Monitor', 'packing'), ('Linus', 'Laptop', 'new')) AS v
WHERE NOT EXISTS (SELECT 1 FROM orders);
