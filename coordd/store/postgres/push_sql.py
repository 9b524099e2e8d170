"""The wake-ups of the parked calls on PostgreSQL (coordd.push): triggers that NOTIFY
PUSH_CHANNEL at the commit of a change a parked `wait_job`, `watch_worker` or
`watch_events` waits for, as SQLite's TEMP triggers and job hook note it
(coordd.store.push). The payload is what changed:

- `t<job_id>`: the job reached a terminal status (`wait_job`);
- `c<worker_id>`: a cancel was requested for a job the worker holds, or coordd's
  governance suspended its lease or told it to vacate (`watch_worker`);
- `e`: new job events (`watch_events`; one per transaction: equal payloads fold).

A NOTIFY is delivered at its transaction's commit and never replayed: a listener that
lost its session wakes every parked call (coordd.store.postgres.coordination).
"""

from __future__ import annotations

PUSH_CHANNEL = "coordd_push"

MIGRATION_PUSH = f"""
CREATE FUNCTION coordd_push_job() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE holder text;
BEGIN
    IF NEW.status IN ('succeeded', 'failed', 'cancelled', 'skipped')
            AND OLD.status IS DISTINCT FROM NEW.status THEN
        PERFORM pg_notify('{PUSH_CHANNEL}', 't' || NEW.job_id);
    END IF;
    IF NEW.cancel_requested AND NOT OLD.cancel_requested THEN
        SELECT worker_id INTO holder FROM leases WHERE job_id = NEW.job_id;
        IF holder IS NOT NULL THEN
            PERFORM pg_notify('{PUSH_CHANNEL}', 'c' || holder);
        END IF;
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER push_job AFTER UPDATE OF status, cancel_requested ON jobs FOR EACH ROW
    WHEN (OLD.status IS DISTINCT FROM NEW.status
          OR OLD.cancel_requested IS DISTINCT FROM NEW.cancel_requested)
    EXECUTE FUNCTION coordd_push_job();
CREATE FUNCTION coordd_push_lease() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('{PUSH_CHANNEL}', 'c' || NEW.worker_id);
    RETURN NULL;
END $$;
CREATE TRIGGER push_lease AFTER UPDATE OF suspended_at, vacate_reason ON leases FOR EACH ROW
    WHEN ((NEW.suspended_at IS NOT NULL AND OLD.suspended_at IS NULL)
          OR (NEW.vacate_reason IS NOT NULL AND OLD.vacate_reason IS NULL))
    EXECUTE FUNCTION coordd_push_lease();
CREATE FUNCTION coordd_push_events() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('{PUSH_CHANNEL}', 'e');
    RETURN NULL;
END $$;
CREATE TRIGGER push_events AFTER INSERT ON job_events FOR EACH STATEMENT
    EXECUTE FUNCTION coordd_push_events();
"""

__all__ = ["MIGRATION_PUSH", "PUSH_CHANNEL"]
