"""The stores: the store interface every store implements (api.py, api_*.py), the SQLite
store (sqlite/) and the PostgreSQL store (postgres/); beside api*.py, SQLite's statements.
May import net, ops, rules, wire and the base modules; never service or daemon (the layers
contract).

SQLite's statements, one module per area: jobs.py (a job's rows: enqueue, `apply` of each
coordd.rules.transitions decision, cancel, retry, lost leases, events), workers.py (the
heartbeat, incarnations), upkeep.py (prune, vacuum, optimize, WAL checkpoint), schema.py
(migrations, PRAGMAs), claim_index.py, workflows.py, schedules.py, workflow_reads.py,
limits.py, resources.py, governance.py, messages.py, logs.py, views.py (rows -> views) and
the rest. They run inside the single writer's transaction (coordd.store.sqlite.writer)
with `now` from coordd's clock. The SQLite store over them is coordd.store.sqlite; the
PostgreSQL store (coordd.store.postgres) has its own statements and imports none of
SQLite's store.

This module holds no code; it names a few things from the modules where they live, for
the callers that reach them through the package (the PostgreSQL store, the SQLite writer,
the service's intake, and bench/, which also runs against revisions before this layout):
the store interface's `NewJob`, the claim's `CLAIM_SCAN`, the stored-JSON helpers
(coordd.jsontext) and the schema's PRAGMAs and `migrate` (coordd.store.schema).
"""

from __future__ import annotations

from coordd.jsontext import (  # noqa: F401 (re-exported)
    UNDECODABLE_SHOWN_CHARS, dumps, json_decode, json_encode, lenient_json, maybe_json,
)
from coordd.rules.claim_policy import CLAIM_SCAN  # noqa: F401 (re-exported)
from coordd.store.api import NewJob  # noqa: F401 (re-exported)
from coordd.store.schema import (  # noqa: F401 (re-exported)
    PRAGMA_CHECKPOINT_TRUNCATE, PRAGMA_JOURNAL_SIZE_LIMIT, PRAGMA_WAL_AUTOCHECKPOINT,
    PRAGMAS_WRITER, SCHEMA_VERSION, migrate, prepare_new_file,
)
