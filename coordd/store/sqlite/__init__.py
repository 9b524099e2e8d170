"""The SQLite store: SQLiteStore (store) over the single writer with its group commit
(writer, lanes, job_changes), the read pool (readers), the checkpointer and the lock on
the file (dblock); the claim walk and the fenced calls (claims, leases, preemption_ops),
one `*_ops` mixin per area, backup/restore and the admin's offline reads (offline).
May import coordd.store's statements and interface, net, ops, rules, wire and the base
modules; the PostgreSQL store never imports it (the postgres-not-sqlite contract).
"""
