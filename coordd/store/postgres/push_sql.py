"""The wake-ups of the parked calls on PostgreSQL (coordd.service.push): triggers that NOTIFY
PUSH_CHANNEL at the commit of a change a parked `wait_job`, `watch_worker` or
`watch_events` waits for, as SQLite's TEMP triggers and job hook note it
(coordd.store.push). The payload is what changed:

- `t<job_id>`: the job reached a terminal status (`wait_job`), while wanted;
- `c<worker_id>`: a cancel was requested for a job the worker holds, or coordd's
  governance suspended its lease or told it to vacate (`watch_worker`);
- `e`: new job events (`watch_events`; one per transaction: equal payloads fold), while
  wanted.

"While wanted": `want_wakeups` (coordd.store.api_waits) is awaited before a parked call's
first look, so a change that commits after the look finds the flag on and sends.

Parked claims are woken by WORK_CHANNEL (MIGRATION_CLAIM_WAKE), whoever writes the job
(this coordd, a standby, an application's own transaction: coordd.store.postgres.enqueue_tx):

- `w<role>US<kind>US<ahead_s>US<job_id>` (US = chr(31)): the job entered `waiting`; `ahead_s`
  is empty when it is due now, else how far its run_at lies ahead of the database's clock
  (coordd's run_at timer takes it from there). The job id keeps the NOTIFYs of one
  transaction apart (equal payloads fold): one wake credit per job, as on SQLite;
- `l<limit>`: units of a fleet-wide limit freed (a hold went with its lease);
- `` (empty): something may have become claimable: every parked claim looks again.

A NOTIFY is delivered at its transaction's commit and never replayed: a listener that
lost its session wakes every parked call (coordd.store.postgres.coordination).
"""

from __future__ import annotations

PUSH_CHANNEL = "coordd_push"

WANT_SLACK_S = 60.0  # a wanted wake-up stays on this long past the wait that asked

# `t` and `e` are sent only while coordd wants them (a parked `wait_job` / `watch_events`:
# push_wanted.until ahead of the clock): claims and completes NOTIFY nothing otherwise,
# since each NOTIFY takes the server's notify-queue lock at commit. `c` is rare: always.
MIGRATION_PUSH = f"""
CREATE TABLE push_wanted (what text PRIMARY KEY, until float8 NOT NULL);
CREATE FUNCTION coordd_push_wanted(w text) RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM push_wanted WHERE what = w
                   AND until > extract(epoch FROM clock_timestamp()))
$$;
CREATE FUNCTION coordd_push_ended() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF coordd_push_wanted('t') THEN
        PERFORM pg_notify('{PUSH_CHANNEL}', 't' || NEW.job_id);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER push_ended AFTER UPDATE OF status ON jobs FOR EACH ROW
    WHEN (NEW.status IN ('succeeded', 'failed', 'cancelled', 'skipped')
          AND OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION coordd_push_ended();
CREATE FUNCTION coordd_push_cancel() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE holder text;
BEGIN
    SELECT worker_id INTO holder FROM leases WHERE job_id = NEW.job_id;
    IF holder IS NOT NULL THEN
        PERFORM pg_notify('{PUSH_CHANNEL}', 'c' || holder);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER push_cancel AFTER UPDATE OF cancel_requested ON jobs FOR EACH ROW
    WHEN (NEW.cancel_requested AND NOT OLD.cancel_requested)
    EXECUTE FUNCTION coordd_push_cancel();
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
    IF coordd_push_wanted('e') THEN
        PERFORM pg_notify('{PUSH_CHANNEL}', 'e');
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER push_events AFTER INSERT ON job_events FOR EACH STATEMENT
    EXECUTE FUNCTION coordd_push_events();
"""
WORK_CHANNEL = "coordd_work"
US = chr(31)  # the field separator of a `w` payload (names never hold control characters)

# Row triggers whose WHEN filters before any function runs: a claim, renew or complete
# (status to running or terminal) costs no call and sends nothing.
MIGRATION_CLAIM_WAKE = f"""
CREATE FUNCTION coordd_wake_waiting() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE ahead float8 := NEW.run_at - extract(epoch FROM now());
BEGIN
    PERFORM pg_notify('{WORK_CHANNEL}', 'w' || NEW.required_role || chr(31) || NEW.kind
        || chr(31) || CASE WHEN ahead > 0 THEN ahead::text ELSE '' END || chr(31)
        || NEW.job_id);
    RETURN NULL;
END $$;
CREATE TRIGGER wake_inserted AFTER INSERT ON jobs FOR EACH ROW
    WHEN (NEW.status = 'waiting') EXECUTE FUNCTION coordd_wake_waiting();
CREATE TRIGGER wake_waiting AFTER UPDATE OF status ON jobs FOR EACH ROW
    WHEN (NEW.status = 'waiting' AND OLD.status IS DISTINCT FROM 'waiting')
    EXECUTE FUNCTION coordd_wake_waiting();
CREATE FUNCTION coordd_wake_limit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('{WORK_CHANNEL}', 'l' || OLD.name);
    RETURN NULL;
END $$;
CREATE TRIGGER wake_limit_freed AFTER DELETE ON limit_holds FOR EACH ROW
    EXECUTE FUNCTION coordd_wake_limit();
"""
SQL_WANT = (  # $1 what, $2 seconds from the database's clock
    "INSERT INTO push_wanted (what, until) VALUES ($1, extract(epoch FROM clock_timestamp()) "
    "+ $2) ON CONFLICT (what) DO UPDATE SET until = greatest(push_wanted.until, "
    "EXCLUDED.until)"
)

# The two triggers on every claim and complete look push_wanted up in PL/pgSQL itself
# (its plan kept for the session) rather than through coordd_push_wanted, an SQL function
# PL/pgSQL cannot inline, planned anew in every transaction (about 0.15 ms a call).
MIGRATION_PUSH_CACHED = f"""
CREATE OR REPLACE FUNCTION coordd_push_ended() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM push_wanted WHERE what = 't'
               AND until > extract(epoch FROM clock_timestamp())) THEN
        PERFORM pg_notify('{PUSH_CHANNEL}', 't' || NEW.job_id);
    END IF;
    RETURN NULL;
END $$;
CREATE OR REPLACE FUNCTION coordd_push_events() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM push_wanted WHERE what = 'e'
               AND until > extract(epoch FROM clock_timestamp())) THEN
        PERFORM pg_notify('{PUSH_CHANNEL}', 'e');
    END IF;
    RETURN NULL;
END $$;
"""

__all__ = ["MIGRATION_CLAIM_WAKE", "MIGRATION_PUSH", "MIGRATION_PUSH_CACHED", "PUSH_CHANNEL",
           "SQL_WANT", "US", "WANT_SLACK_S", "WORK_CHANNEL"]
