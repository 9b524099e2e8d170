"""Schema step "worker state" (issue 14): a worker's incarnation, advertised and broken
kinds, and goodbye time; a job's count of hand-backs that spent no attempt.

Kept apart from coordd.store.workers so coordd.store can list it in MIGRATIONS without an
import cycle. Its own step: renumber it freely beside other branches' migrations.
"""

MIGRATION_WORKER_STATE = """
    ALTER TABLE workers ADD COLUMN incarnation TEXT;
    ALTER TABLE workers ADD COLUMN kinds_json TEXT;
    ALTER TABLE workers ADD COLUMN broken_kinds_json TEXT;
    ALTER TABLE workers ADD COLUMN offline_at REAL;
    ALTER TABLE jobs ADD COLUMN preemptions INTEGER NOT NULL DEFAULT 0
"""
