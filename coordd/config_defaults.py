"""The default and the range of coordd's numeric settings: a named default per key that
coordd.config.Config takes (and a few bounds other modules share, e.g.
MESSAGE_VISIBILITY_MAX_S), and RANGES and GATE_RANGES, the range coordd.rules.ranges
checks for every numeric key of Config and of a `[gates.pN]` table. Data only.
"""

from __future__ import annotations

from coordd.rules import ranges

LEASE_DEFAULT_S = 30.0
LEASE_MIN_S = 1.0
LEASE_MAX_S = 3600.0
HEARTBEAT_STALE_S = 30.0
REAPER_INTERVAL_S = 5.0
MAX_ATTEMPTS_DEFAULT = 3
BACKOFF_BASE_S = 5.0
BACKOFF_CAP_S = 600.0
BACKOFF_JITTER = 0.25
MAX_PAYLOAD_BYTES = 1 << 20
MAX_RESULT_BYTES = 8 << 20
MAX_CHECKPOINT_BYTES = 1 << 20
MAX_ERROR_CHARS = 4000
WRITER_QUEUE_MAX = 20_000
MAX_INBOUND_BYTES = 256 << 20
FRAME_TIMEOUT_S = 60.0
MAX_UNSENT_BYTES = 32 << 20
MAX_OUTBOUND_BYTES = 256 << 20
WRITE_STALL_TIMEOUT_S = 30.0
WRITER_BATCH_MAX = 1024
READ_CONNECTIONS = 4
READ_QUEUE_MAX = 256
CLOCK_JUMP_S = 60.0
CLOCK_STEP_S = 1.0
BUSY_TIMEOUT_MS = 10_000
RETENTION_S = 7 * 86400.0
PRUNE_INTERVAL_S = 3600.0
WORKFLOW_ABSENT_WAIT_S = 300.0
MESSAGE_MAX_BYTES = 256 << 10
MESSAGE_VISIBILITY_S = 60.0
MESSAGE_VISIBILITY_MAX_S = 12 * 3600.0  # the longest a read may hide a message (config or read)
AGENT_STALE_S = 300.0
WARN_P0_WAIT_S = 300.0  # a user waiting five minutes: something is wrong
PARK_MAX_PER_CONNECTION = 16
PARK_MAX_TOTAL = 10_000
PARK_WAIT_MAX_S = 300.0

_S, _S0, _N0, _N1 = ranges.POSITIVE_S, ranges.NON_NEGATIVE_S, ranges.NON_NEGATIVE, ranges.AT_LEAST_ONE
RANGES: dict[str, ranges.Range] = {
    "lease_default_s": _S, "lease_min_s": _S, "lease_max_s": _S, "heartbeat_stale_s": _S,
    "reaper_interval_s": _S, "store_session_timeout_s": _S, "max_attempts_default": _N1, "backoff_base_s": _S0,
    "backoff_cap_s": _S0, "backoff_jitter": ranges.FRACTION, "aging_interval_s": _S0,
    "max_payload_bytes": _N1, "max_result_bytes": _N1, "max_checkpoint_bytes": _N1,
    "max_error_chars": _N1, "max_frame_bytes": ranges.Range(1024),
    "max_inbound_bytes": _N1, "frame_timeout_s": _S, "max_unsent_bytes": _N1,
    "max_outbound_bytes": _N1, "write_stall_timeout_s": _S, "writer_queue_max": _N1,
    "writer_batch_max": _N1, "read_connections": _N1, "read_queue_max": _N0,
    "clock_jump_s": _S0, "clock_step_s": _S, "busy_timeout_ms": _N0, "admin_uids": _N0,
    "admin_gids": _N0, "retention_s": _S0, "prune_interval_s": _S,
    "metrics_port": ranges.Range(0, 65535), "wal_size_limit_bytes": _N0,
    "wal_autocheckpoint_pages": _N1, "wal_checkpoint_interval_s": _S0, "warn_db_bytes": _N0,
    "warn_wal_bytes": _N0, "warn_artifact_bytes": _N0, "warn_p0_wait_s": _S0,
    "workflow_absent_wait_s": _S,
    "message_max_bytes": _N1, "agent_stale_s": _S, "message_retention_s": _S0,
    "message_visibility_s": ranges.Range(0, MESSAGE_VISIBILITY_MAX_S, low_open=True),
    "preempt_gap": ranges.Range(0, 3), "preempt_min_runtime_s": _S0, "reservation_s": _S,
    "park_max_per_connection": _N0, "park_max_total": _N0,
    "park_wait_max_s": ranges.Range(0, 86400),
    "tls_handshake_timeout_s": _S, "tcp_user_timeout_s": _S, "max_upload_bytes": _N1,
}
"""The range of every numeric key (coordd.rules.ranges.check): finite, and > 0, >= 0, >= 1 or
a fraction as each means."""
GATE_RANGES: dict[str, ranges.Range] = {
    "max_memory_pct": ranges.PERCENT, "max_temperature_c": ranges.Range(-273.15),
    "min_battery_pct": ranges.PERCENT, "min_user_idle_s": _S0,
    "max_gpu_temperature_c": ranges.Range(-273.15),
}
