-- The notes of several users, one table. The relay reads its changes from the WAL: no trigger, no NOTIFY.
CREATE TABLE IF NOT EXISTS public.notes (
  id         serial PRIMARY KEY,
  owner_id   text NOT NULL,
  body       text NOT NULL,
  updated_at timestamptz NOT NULL DEFAULT now()
);

-- The WAL record of an update or a delete then carries the whole old row, owner_id included: the relay needs the
-- old owner to tell the user a row left (a moving update) or was deleted. It refuses a routed table without it.
ALTER TABLE public.notes REPLICA IDENTITY FULL;

INSERT INTO public.notes (owner_id, body)
SELECT * FROM (VALUES ('alice', 'Book the train to Lyon'), ('alice', 'Draft the quarterly plan'),
                      ('bob', 'Call the plumber'), ('bob', 'Return the library books'),
                      ('carol', 'Water the plants')) AS v
WHERE NOT EXISTS (SELECT 1 FROM public.notes);
