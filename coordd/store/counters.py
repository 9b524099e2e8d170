"""Job counters by (status, priority): the `job_counts` table and its reads.

`status` reads these rows instead of counting the jobs table (O(1) at any size). Since
v13 the writer keeps them (coordd.store.sqlite.job_changes: one hook per job row change, one upsert
per changed counter per batch, in the batch's transaction); the triggers below are only
the v10 migration's, which v13 drops.
"""

from __future__ import annotations

TRIGGERS = """
    CREATE TRIGGER jobs_count_insert AFTER INSERT ON jobs BEGIN
        INSERT INTO job_counts (status, priority, n) VALUES (NEW.status, NEW.priority, 1)
            ON CONFLICT (status, priority) DO UPDATE SET n = n + 1;
    END;
    CREATE TRIGGER jobs_count_delete AFTER DELETE ON jobs BEGIN
        UPDATE job_counts SET n = n - 1 WHERE status = OLD.status AND priority = OLD.priority;
    END;
    CREATE TRIGGER jobs_count_update AFTER UPDATE OF status, priority ON jobs
        WHEN OLD.status IS NOT NEW.status OR OLD.priority IS NOT NEW.priority BEGIN
        UPDATE job_counts SET n = n - 1 WHERE status = OLD.status AND priority = OLD.priority;
        INSERT INTO job_counts (status, priority, n) VALUES (NEW.status, NEW.priority, 1)
            ON CONFLICT (status, priority) DO UPDATE SET n = n + 1;
    END;
"""

# The counters migration (issue 21): the table, one full count to start from, the triggers.
MIGRATION = """
    CREATE TABLE job_counts (
        status   TEXT NOT NULL,
        priority INTEGER NOT NULL,
        n        INTEGER NOT NULL,
        PRIMARY KEY (status, priority)
    ) WITHOUT ROWID;
    INSERT INTO job_counts (status, priority, n)
        SELECT status, priority, count(*) FROM jobs GROUP BY status, priority;
""" + TRIGGERS

SQL_COUNTS = "SELECT status, priority, n FROM job_counts WHERE n <> 0"
SQL_FULL_COUNTS = "SELECT status, priority, count(*) FROM jobs GROUP BY status, priority"
