"""coordd's configuration: one msgspec Struct loaded from TOML (stdlib tomllib).

Every knob has a default beside it; unknown keys are an error (a typo must not silently
fall back to a default). Gate policies per priority live under `[gates.p0]` .. `[gates.p3]`;
keys given there replace the built-in defaults of `coordd.rules.gates.default_policies`.
"""

from __future__ import annotations

import os
import re
import tomllib
from typing import Any

import msgspec

from coordd import conffile
# Here: Config (every key, its meaning, the rules between keys) and `load`. Each numeric
# key's named default and range: coordd.config_defaults; default file locations: coordd.paths.
from coordd.config_defaults import (
    LEASE_DEFAULT_S, LEASE_MIN_S, LEASE_MAX_S, HEARTBEAT_STALE_S, REAPER_INTERVAL_S,
    MAX_ATTEMPTS_DEFAULT, BACKOFF_BASE_S, BACKOFF_CAP_S, BACKOFF_JITTER, MAX_PAYLOAD_BYTES,
    MAX_RESULT_BYTES, MAX_CHECKPOINT_BYTES, MAX_ERROR_CHARS, WRITER_QUEUE_MAX,
    MAX_INBOUND_BYTES, FRAME_TIMEOUT_S, MAX_UNSENT_BYTES, MAX_OUTBOUND_BYTES,
    WRITE_STALL_TIMEOUT_S, WRITER_BATCH_MAX, READ_CONNECTIONS, READ_QUEUE_MAX, CLOCK_JUMP_S,
    CLOCK_STEP_S, BUSY_TIMEOUT_MS, RETENTION_S, PRUNE_INTERVAL_S, WORKFLOW_ABSENT_WAIT_S,
    MESSAGE_MAX_BYTES, MESSAGE_VISIBILITY_S, AGENT_STALE_S, WARN_P0_WAIT_S,
    PARK_MAX_PER_CONNECTION, PARK_MAX_TOTAL, PARK_WAIT_MAX_S, GATE_RANGES, RANGES,
)
from coordd.config_defaults import MESSAGE_VISIBILITY_MAX_S  # noqa: F401 (service.hub)
from coordd.rules import ranges
from coordd.errors import BadRequest, ConfigError
from coordd.rules.gates import GatePolicy, default_policies, merge
from coordd.rules.limits import LimitBook, LimitSpec
from coordd.rules.names import check_name
from coordd.wire.limits import LimitUse
from coordd.wire.protocol import MAX_FRAME_DEFAULT
from coordd.rules.results import SCHEMAS


class Config(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """coordd settings. Durations in seconds, sizes in bytes.

    Attributes:
        db: SQLite file path ("" = the default state directory).
        socket: Unix socket path ("" = the default runtime directory).
        store: "" = SQLite at `db`; a `postgresql://` DSN = the PostgreSQL store, with a
            standby coordd waiting on its advisory lock (docs/guides/postgresql.md).
        store_session_timeout_s: PostgreSQL store: the server ends the active coordd's
            lock session once it is silent this long (idle_session_timeout and TCP
            keepalives on that session), so a standby takes over a frozen or cut-off host
            about this long after; the active probes it every third of it and exits when
            a probe fails.
        lease_default_s: the lease length granted to a claim that asks for none.
        lease_min_s: the shortest lease granted; a claim asking less gets this.
        lease_max_s: the longest lease granted; a claim asking more gets this.
        heartbeat_stale_s: a worker whose last heartbeat is older gets no claim.
        reaper_interval_s: how often expired leases are reaped.
        max_attempts_default: attempts a job gets unless enqueue says otherwise.
        backoff_base_s: the retry delay after a job's first retryable failure; it doubles
            with each further attempt: min(cap, base * 2**(attempts-1)) * (1 + U(0, jitter)).
        backoff_cap_s: the longest retry delay before jitter (the doubling stops here).
        backoff_jitter: a random share, 0 up to this, added to each retry delay (never
            taken off), so jobs that failed together do not come back together.
        aging_interval_s: priority aging; a waiting job's effective priority improves one
            step per interval (never above P0). 0 = off (strict priority).
        max_payload_bytes: cap on a job's payload JSON (and its gates) at enqueue.
        max_result_bytes: cap on a job's result JSON kept in the database.
        max_checkpoint_bytes: cap on a checkpoint's JSON kept in the database.
        max_error_chars: a failure's error text is truncated to this.
        max_frame_bytes: RPC frame cap.
        max_inbound_bytes: partial request frames buffered, all connections together (a
            frame over 64 KiB counts its announced length while it arrives); past it a new
            large frame is refused `overloaded` and its connection closed.
        frame_timeout_s: a request frame must be whole this long after its first byte, or
            its connection is closed (a trickling peer holds no buffer for ever).
        max_unsent_bytes: reply bytes held unsent for one connection whose peer does not
            read; past it, a reply over 64 KiB on that connection waits until it reads.
        max_outbound_bytes: reply bytes held unsent, all connections together; past it, a
            reply over 64 KiB becomes `overloaded`.
        write_stall_timeout_s: a peer that reads none of its unsent replies this long is
            dropped (its buffers freed).
        writer_queue_max: writes accepted but not yet committed, per lane (new work;
            holder calls and maintenance); past it a write is refused `overloaded`.
        writer_batch_max: writes committed together in one transaction at most (group
            commit).
        read_connections: read-only connections (each its own thread) serving reads.
        read_queue_max: reads waiting for a read connection; past it a read gets
            `overloaded` at once.
        clock_step_s: coordd keeps its own clock (the wall clock at start plus monotonic
            time since); when the wall clock steps further than this away from it, either
            way, coordd takes the step and moves the stored lease, heartbeat, backoff,
            queue and message times by it, so their durations keep their real length.
        clock_jump_s: a jump ahead larger than this (a suspend/resume) also gives each
            live lease at least one whole lease from the resume.
        busy_timeout_ms: how long a SQLite statement waits for another process holding
            the database file's lock (a backup tool, a `sqlite3` shell) before it fails.
        admin_uids: the uids that may call admin methods. With admin_gids also empty
            (the default): root and coordd's own uid. Either set: exactly those listed.
        admin_gids: the group ids that may call admin methods (the caller process's gid,
            as the socket reports it), beside admin_uids.
        log_json: log lines as JSON objects.
        gates: per-priority gate overrides, keys "p0".."p3".
        preempt_gap: priority preemption (coordd.rules.preemption): a waiting job no worker
            has room for preempts a running one at least this many priorities lower
            (0 = never).
        preempt_min_runtime_s: a running job is preempted only once it has run this long.
        reservation_s: the capacity a preemption frees is kept for the waiting job this
            long; after it, any job may take it.
        retention_s: terminal jobs finished longer ago are pruned (with their events).
        prune_interval_s: how often the reaper prunes (and returns free pages to the disk).
        wal_size_limit_bytes: the WAL file is cut back to this size each time it restarts
            after a checkpoint (SQLite checkpoints it every ~1,000 pages of commits); past
            it, or past half the disk's free space, the writer cuts it to 0 with a
            TRUNCATE checkpoint (coordd.store.sqlite.checkpointer).
        wal_autocheckpoint_pages: past this many WAL pages the writer checkpoints inside
            its own commit (the safety net that lets the WAL restart).
        wal_checkpoint_interval_s: seconds between background checkpoints while writes
            happen (a thread, off the writer's path; 0 = only the in-commit ones).
        warn_db_bytes: `status` warns when the database file is larger.
        warn_wal_bytes: `status` warns when the WAL file is larger.
        warn_artifact_bytes: `status` warns when the artifact store is larger (its size as
            measured by the last prune or metrics scrape).
        warn_p0_wait_s: `status` (and `top`) warn when a due P0 job has waited longer
            than this, naming it and why it waits (0 = never).
        metrics_port: serve Prometheus metrics over HTTP on 127.0.0.1:PORT (0 = off; the
            `metrics` RPC and `coordctl metrics` always work). Gauges refresh every reaper
            round.
        workflow_absent_wait_s: a waiting workflow node whose capability (required_role)
            no live worker advertised for this long is skipped (reason `worker_absent`).
        result_schemas: job kind -> result schema name (coordd.rules.results.SCHEMAS) for jobs
            and nodes that do not name one.
        message_max_bytes: cap on a message's content JSON (and, separately, its metadata).
        message_visibility_s: a read message not acked within this comes back (at least once);
            at most MESSAGE_VISIBILITY_MAX_S, the bound a read's own visibility_s has too.
        message_retention_s: processed messages and broadcasts older than this are purged
            by the prune round (expired messages are purged by every prune round).
        agent_stale_s: an agent whose last status update is older is shown as not live.
        park_max_per_connection: parked calls (claim with wait_s, wait_job,
            watch_worker, watch_events) one connection may have; one more is refused
            `overloaded`.
        park_max_total: parked calls allowed over all connections together; one more is
            refused `overloaded`.
        park_wait_max_s: the longest a call may stay parked (longer asks are cut to it).
        limits: fleet-wide limits by name (`[limits.NAME]`: concurrency, rate, reserve,
            budget, budget_reserve; coordd.rules.limits); `coordctl limits set` overrides them
            at runtime (kept in the database, over this file's values).
        kind_limits: kind -> the limits its jobs consume when enqueue names none
            (names or {name, units}).
        listen_tcp: "HOST:PORT" of the TCP listener for workers on other hosts ("" = off);
            TLS 1.3 with a required client certificate (coordd.net.tls).
        tls_cert: coordd's certificate (PEM file) for its TCP and enrolment listeners;
            needed with listen_tcp, as are tls_key and tls_client_ca.
        tls_key: the private key (PEM file) of tls_cert; needed with listen_tcp.
        tls_client_ca: the CA certificate(s) (PEM file) that worker and admin certificates
            must chain to on the TCP listener; needed with listen_tcp.
        tcp_insecure_plaintext: the TCP listener speaks plaintext, no identities; only for
            tests, and refused unless listen_tcp's host is a loopback address.
        tls_deny_workers: worker ids (a certificate's coordd-worker://ID) refused on the
            TCP listener whatever their certificate; a SIGHUP loads the file again
            (coordd.daemon.reload) and applies the list if the file validates.
        tls_deny_serials: certificate serial numbers (hex, colons allowed) refused on the
            TCP listener, e.g. a lost host's certificate; reloaded on SIGHUP like
            tls_deny_workers.
        tls_handshake_timeout_s: a TLS handshake must finish within this.
        tcp_user_timeout_s: TCP_USER_TIMEOUT (with keepalive) of accepted TCP sockets: a
            peer behind a partition is dropped about this long after data stops being
            acknowledged.
        listen_enroll: "HOST:PORT" of the enrolment listener ("" = off): TLS 1.3 without
            a client certificate, serving only `ca_bundle` and `enroll` (coordd.service.enrol).
        tls_ca_key: the fleet CA's private key, with which `enroll` signs CSRs (the CA
            certificate is the first one in tls_client_ca); needed by listen_enroll.
        max_upload_bytes: the largest file a remote worker may upload into the artifact
            store (`artifact_put`: a result or checkpoint).
        restart_grace: at start, every lease still in the database runs at least one more
            of its `lease_s` from then, so workers that reconnect keep their jobs.
    """

    db: str = ""
    socket: str = ""
    store: str = ""
    store_session_timeout_s: float = 5.0
    lease_default_s: float = LEASE_DEFAULT_S
    lease_min_s: float = LEASE_MIN_S
    lease_max_s: float = LEASE_MAX_S
    heartbeat_stale_s: float = HEARTBEAT_STALE_S
    reaper_interval_s: float = REAPER_INTERVAL_S
    max_attempts_default: int = MAX_ATTEMPTS_DEFAULT
    backoff_base_s: float = BACKOFF_BASE_S
    backoff_cap_s: float = BACKOFF_CAP_S
    backoff_jitter: float = BACKOFF_JITTER
    aging_interval_s: float = 0.0
    max_payload_bytes: int = MAX_PAYLOAD_BYTES
    max_result_bytes: int = MAX_RESULT_BYTES
    max_checkpoint_bytes: int = MAX_CHECKPOINT_BYTES
    max_error_chars: int = MAX_ERROR_CHARS
    max_frame_bytes: int = MAX_FRAME_DEFAULT
    max_inbound_bytes: int = MAX_INBOUND_BYTES
    frame_timeout_s: float = FRAME_TIMEOUT_S
    max_unsent_bytes: int = MAX_UNSENT_BYTES
    max_outbound_bytes: int = MAX_OUTBOUND_BYTES
    write_stall_timeout_s: float = WRITE_STALL_TIMEOUT_S
    writer_queue_max: int = WRITER_QUEUE_MAX
    writer_batch_max: int = WRITER_BATCH_MAX
    read_connections: int = READ_CONNECTIONS
    read_queue_max: int = READ_QUEUE_MAX
    clock_jump_s: float = CLOCK_JUMP_S
    clock_step_s: float = CLOCK_STEP_S
    busy_timeout_ms: int = BUSY_TIMEOUT_MS
    admin_uids: list[int] = []
    admin_gids: list[int] = []
    log_json: bool = False
    gates: dict[str, dict[str, Any]] = {}
    preempt_gap: int = 2
    preempt_min_runtime_s: float = 30.0
    reservation_s: float = 60.0
    retention_s: float = RETENTION_S
    prune_interval_s: float = PRUNE_INTERVAL_S
    metrics_port: int = 0
    wal_size_limit_bytes: int = 64 << 20
    wal_autocheckpoint_pages: int = 10_000
    wal_checkpoint_interval_s: float = 0.1
    warn_db_bytes: int = 8 << 30
    warn_wal_bytes: int = 256 << 20
    warn_artifact_bytes: int = 64 << 30
    warn_p0_wait_s: float = WARN_P0_WAIT_S
    workflow_absent_wait_s: float = WORKFLOW_ABSENT_WAIT_S
    result_schemas: dict[str, str] = {}
    message_max_bytes: int = MESSAGE_MAX_BYTES
    message_visibility_s: float = MESSAGE_VISIBILITY_S
    message_retention_s: float = RETENTION_S
    agent_stale_s: float = AGENT_STALE_S
    park_max_per_connection: int = PARK_MAX_PER_CONNECTION
    park_max_total: int = PARK_MAX_TOTAL
    park_wait_max_s: float = PARK_WAIT_MAX_S
    limits: dict[str, LimitSpec] = {}
    kind_limits: dict[str, list[str | LimitUse]] = {}
    listen_tcp: str = ""
    tls_cert: str = ""
    tls_key: str = ""
    tls_client_ca: str = ""
    tcp_insecure_plaintext: bool = False
    tls_deny_workers: list[str] = []
    tls_deny_serials: list[str] = []
    tls_handshake_timeout_s: float = 10.0
    tcp_user_timeout_s: float = 10.0
    listen_enroll: str = ""
    tls_ca_key: str = ""
    max_upload_bytes: int = 64 << 30
    restart_grace: bool = True

    def __post_init__(self) -> None:
        ranges.check(self, RANGES)  # each numeric key's own range; then the rules between keys
        if self.store and not is_postgres(self.store):
            raise ValueError(f"store must be a postgresql:// DSN (or empty for SQLite), "
                             f"got {self.store.partition('://')[0]!r}")
        if not 0 < self.lease_min_s <= self.lease_default_s <= self.lease_max_s:
            raise ValueError("need 0 < lease_min_s <= lease_default_s <= lease_max_s")
        if self.backoff_base_s < 0 or self.backoff_cap_s < self.backoff_base_s:
            raise ValueError("need 0 <= backoff_base_s <= backoff_cap_s")
        if min(self.max_inbound_bytes, self.max_outbound_bytes) < self.max_frame_bytes:
            raise ValueError("max_inbound_bytes and max_outbound_bytes must be >= "
                             "max_frame_bytes (or no frame of that size could pass)")
        unknown = sorted(set(self.result_schemas.values()) - set(SCHEMAS))
        if unknown:
            raise ValueError(f"result_schemas: unknown schema(s) {unknown}; known: {sorted(SCHEMAS)}")
        self._check_tcp()
        bad = set(self.gates) - {"p0", "p1", "p2", "p3"}
        if bad:
            raise ValueError(f"gates: unknown priority table(s) {sorted(bad)}; use p0..p3")
        for prio, policy in self.policies().items():  # gate keys now, not at the first claim
            ranges.check(policy, GATE_RANGES, prefix=f"gates.p{prio}.")
        self.limit_book()  # [limits.NAME] and kind_limits now, not at the first enqueue

    def limit_book(self) -> LimitBook:
        """A fresh LimitBook of the `[limits.NAME]` tables and `kind_limits`.

        Raises:
            ValueError: a bad limit setting or name, or a kind naming an unknown limit.
        """
        for name in self.limits:
            try:
                check_name("limits: a limit name", name)
            except BadRequest as exc:
                raise ValueError(exc.message) from exc
        return LimitBook(self.limits, self.kind_limits)

    def _check_tcp(self) -> None:
        """The TCP listener needs TLS files, or the plaintext test mode on loopback."""
        from coordd.net.tls import check_deny_lists, is_loopback, split_host_port
        check_deny_lists(self.tls_deny_workers, self.tls_deny_serials)
        if self.listen_enroll:
            split_host_port(self.listen_enroll)
            if not (self.tls_ca_key and self.tls_cert and self.tls_key and self.tls_client_ca):
                raise ValueError("listen_enroll needs tls_ca_key, tls_cert, tls_key and "
                                 "tls_client_ca (it signs with the CA key)")
        if not self.listen_tcp:
            if self.tcp_insecure_plaintext:
                raise ValueError("tcp_insecure_plaintext needs listen_tcp")
            return
        host, _port = split_host_port(self.listen_tcp)
        files = {"tls_cert": self.tls_cert, "tls_key": self.tls_key,
                 "tls_client_ca": self.tls_client_ca}
        if self.tcp_insecure_plaintext:
            if not is_loopback(host):
                raise ValueError(f"tcp_insecure_plaintext is a test mode for loopback only; "
                                 f"listen_tcp {self.listen_tcp!r} is not a loopback address")
            return
        missing = [k for k, v in files.items() if not v]
        if missing:
            raise ValueError(f"listen_tcp {self.listen_tcp!r} needs TLS: set "
                             f"{', '.join(missing)} (coordd never serves TCP in plaintext)")

    def policies(self) -> dict[int, GatePolicy]:
        """Return the effective GatePolicy per priority 0..3 (defaults plus overrides).

        Raises:
            ValueError: a `[gates.pN]` key or value is bad (the message names the table).
        """
        out = default_policies()
        for key, overrides in self.gates.items():
            prio = int(key[1])
            try:
                out[prio] = merge(out[prio], overrides)
            except msgspec.ValidationError as exc:
                msg = str(exc)
                raise ValueError(msg.replace("`$", f"`$.gates.{key}") if "`$" in msg
                                 else f"gates.{key}: {msg}") from exc
        return out


def is_postgres(store: str) -> bool:
    """Whether the `store` setting names a PostgreSQL database (postgresql:// or postgres://)."""
    return store.startswith(("postgresql://", "postgres://"))


def load(path: str | os.PathLike[str] | None, **overrides: Any) -> Config:
    """Load a Config from a TOML file (None = defaults), then apply non-None `overrides`.

    Raises:
        ConfigError: the file is missing or unreadable (coordd.conffile: not a regular
            file, too large, not UTF-8), not TOML, or has unknown keys or bad values.
    """
    data: dict[str, Any] = {}
    if path is not None:
        try:
            data = tomllib.loads(conffile.read(path))
        except conffile.ConfigFileError as exc:
            raise ConfigError(f"config {path}: {exc}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config {path}: not valid TOML: {exc}") from exc
    given = {k: v for k, v in overrides.items() if v is not None}
    data.update(given)
    try:
        return msgspec.convert(data, Config)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{_source(str(exc), given, path)}: "
                          f"{conffile.locate(str(exc), data)}") from exc


def _source(message: str, given: dict[str, Any], path: str | os.PathLike[str] | None) -> str:
    """Where the bad value came from: a flag (`--store`) when the key msgspec names
    (`$.key`, or a check's message starting with the key) was given as an override, else
    the file (or the defaults)."""
    key = re.search(r"`\$\.(\w+)", message) or re.match(r"(\w+) ", message)
    if key is not None and key.group(1) in given:
        return "--" + key.group(1).replace("_", "-")
    return f"config {path or '(defaults)'}"
