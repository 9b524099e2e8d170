"""coordd: a coordinator for AI jobs. The layout is the architecture (docs/internals/layout.md);
pyproject.toml's import-linter contracts keep it, top to bottom:

- daemon/  the process: server, serving, TCP, reload, signals; imports anything below.
- service/ the one Coordinator, one module per area; imports store, net, ops, rules, wire.
- store/   the store interface (api*.py), SQLite (sqlite/), PostgreSQL (postgres/).
- net/     frames, budgets, RPC, listeners, TLS, the process's limits; ops/: metrics.
- rules/   pure decisions; wire/: the protocol's Structs (import nothing of coordd).

Beside them, the base modules any layer may import (clock, errors, ids, jsontext, config,
conffile, cas, process_start) and the client library (client, client_areas, client_leases,
transport, failover: `coordd.client` is public API), which import no daemon, service, store
or ops.
"""
