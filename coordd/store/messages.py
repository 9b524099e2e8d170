"""The message hub's schema and SQL: messages between agents, their delivery, agent status.

Functions are synchronous, take an open `sqlite3.Connection` and `now` (coordd's clock),
and run inside the writer's transaction (writes) or on the read-only connection (reads),
like the rest of `coordd.store`.

Delivery state is kept per reader in `message_reads`, one row per (message, reader):
a broadcast has many readers, so one status column on `messages` cannot say who has it.
For a direct message `messages.status` / `processed_at` mirror its one reader's row
(pending -> delivered -> processed), so the issue's columns answer at a glance; a
broadcast's row stays `pending` (a reader arriving later still gets it until it expires).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any

import msgspec

from coordd import errors

# The hub's migration: one self-contained script (appended to store.MIGRATIONS; it does
# not depend on its position there).
MIGRATION = """
CREATE TABLE messages (
    message_id   TEXT PRIMARY KEY,
    sender       TEXT NOT NULL,
    recipient    TEXT,
    message_type TEXT NOT NULL,
    content      TEXT NOT NULL,
    priority     INTEGER NOT NULL CHECK (priority BETWEEN 0 AND 3),
    metadata     TEXT,
    status       TEXT NOT NULL CHECK (status IN ('pending','delivered','processed')),
    created_at   REAL NOT NULL,
    processed_at REAL,
    expires_at   REAL
);
CREATE INDEX messages_inbox ON messages (recipient, priority, created_at)
    WHERE status != 'processed';
CREATE INDEX messages_expiry ON messages (expires_at) WHERE expires_at IS NOT NULL;
CREATE INDEX messages_done ON messages (processed_at) WHERE processed_at IS NOT NULL;
CREATE INDEX messages_created ON messages (created_at);
CREATE TABLE message_reads (
    message_id   TEXT NOT NULL REFERENCES messages(message_id) ON DELETE CASCADE,
    reader       TEXT NOT NULL,
    deliveries   INTEGER NOT NULL,
    delivered_at REAL NOT NULL,
    visible_at   REAL,
    processed_at REAL,
    PRIMARY KEY (message_id, reader)
) WITHOUT ROWID;
CREATE INDEX message_reads_reader ON message_reads (reader, processed_at);
CREATE TABLE agents (
    name          TEXT PRIMARY KEY,
    status        TEXT NOT NULL,
    metadata      TEXT,
    heartbeat_at  REAL NOT NULL,
    first_seen_at REAL NOT NULL
);
"""

PURGE_BATCH = 500  # messages deleted per statement by `purge`


class NewMessage(msgspec.Struct, kw_only=True):
    """A validated message ready to insert (sizes checked, JSON encoded)."""

    message_id: str
    sender: str
    recipient: str | None
    message_type: str
    content_json: str
    priority: int
    metadata_json: str | None
    expires_at: float | None


SQL_SEND = (
    "INSERT INTO messages (message_id, sender, recipient, message_type, content, priority, "
    "metadata, status, created_at, expires_at) VALUES (?, ?, ?, ?, ?, ?, ?, 'pending', ?, ?) "
    "ON CONFLICT (message_id) DO NOTHING"
)
SQL_MESSAGE_OWNER = "SELECT sender, recipient, expires_at FROM messages WHERE message_id = ?"

# A reader's inbox: its direct messages not yet processed plus broadcasts by others, not
# expired, not processed by it, and not held by a delivery still inside its visibility
# timeout. P0 first, then oldest first. Two index seeks (recipient = ? / IS NULL).
SQL_INBOX = (
    "SELECT m.message_id, m.sender, m.recipient, m.message_type, m.content, m.priority, "
    "m.metadata, m.created_at, m.expires_at, coalesce(r.deliveries, 0) FROM ("
    " SELECT rowid AS rid, * FROM messages INDEXED BY messages_inbox"
    " WHERE recipient = ?1 AND status != 'processed'"
    " UNION ALL SELECT rowid AS rid, * FROM messages INDEXED BY messages_inbox"
    " WHERE recipient IS NULL AND status != 'processed' AND sender != ?1) m "
    "LEFT JOIN message_reads r ON r.message_id = m.message_id AND r.reader = ?1 "
    "WHERE (m.expires_at IS NULL OR m.expires_at > ?2) "
    "AND r.processed_at IS NULL AND (r.visible_at IS NULL OR r.visible_at <= ?2) "
    "ORDER BY m.priority, m.created_at, m.rid LIMIT ?3"
)
SQL_DELIVER = (
    "INSERT INTO message_reads (message_id, reader, deliveries, delivered_at, visible_at, "
    "processed_at) VALUES (?1, ?2, 1, ?3, ?4, ?5) ON CONFLICT (message_id, reader) DO UPDATE "
    "SET deliveries = deliveries + 1, delivered_at = ?3, visible_at = ?4, processed_at = ?5"
)
SQL_MARK_DIRECT = (
    "UPDATE messages SET status = ?1, processed_at = ?2 "
    "WHERE message_id = ?3 AND recipient IS NOT NULL AND status != 'processed'"
)
SQL_ACK = (
    "UPDATE message_reads SET processed_at = ?1, visible_at = NULL "
    "WHERE message_id = ?2 AND reader = ?3 AND processed_at IS NULL"
)
SQL_PURGE_EXPIRED = (
    "DELETE FROM messages WHERE message_id IN (SELECT message_id FROM messages "
    "INDEXED BY messages_expiry WHERE expires_at IS NOT NULL AND expires_at <= ? LIMIT ?)"
)
SQL_PURGE_PROCESSED = (
    "DELETE FROM messages WHERE message_id IN (SELECT message_id FROM messages "
    "INDEXED BY messages_done WHERE processed_at IS NOT NULL AND processed_at < ? LIMIT ?)"
)
SQL_PURGE_OLD_BROADCASTS = (
    "DELETE FROM messages WHERE message_id IN (SELECT message_id FROM messages "
    "INDEXED BY messages_created WHERE created_at < ? AND recipient IS NULL LIMIT ?)"
)

SQL_AGENTS_PURGE = (
    "DELETE FROM agents WHERE name IN (SELECT name FROM agents WHERE heartbeat_at < ? LIMIT ?)"
)
SQL_AGENT_UPSERT = (
    "INSERT INTO agents (name, status, metadata, heartbeat_at, first_seen_at) "
    "VALUES (?1, ?2, ?3, ?4, ?4) ON CONFLICT (name) DO UPDATE SET status = excluded.status, "
    "metadata = coalesce(excluded.metadata, agents.metadata), heartbeat_at = excluded.heartbeat_at"
)
# A page of agents, by name (the primary key's order).
SQL_AGENTS = (
    "SELECT name, status, metadata, heartbeat_at, first_seen_at FROM agents "
    "WHERE (?1 IS NULL OR name = ?1) AND (?2 IS NULL OR name > ?2) ORDER BY name LIMIT ?3"
)
# Unread (not yet acked, whether never delivered or delivered and held) is counted from
# three index walks instead of one scan of every live broadcast per agent:
#   direct messages to the agent not processed, plus
#   live broadcasts - those the agent sent - those the agent has acked.
SQL_UNREAD_DIRECT = (
    "SELECT count(*) FROM messages INDEXED BY messages_inbox WHERE recipient = ?1 "
    "AND status != 'processed' AND (expires_at IS NULL OR expires_at > ?2)"
)
SQL_LIVE_BROADCASTS_BY_SENDER = (
    "SELECT sender, count(*) FROM messages INDEXED BY messages_inbox WHERE recipient IS NULL "
    "AND status != 'processed' AND (expires_at IS NULL OR expires_at > ?1) GROUP BY sender"
)
SQL_BROADCASTS_ACKED = (
    "SELECT count(*) FROM message_reads r INDEXED BY message_reads_reader "
    "JOIN messages m ON m.message_id = r.message_id WHERE r.reader = ?1 "
    "AND r.processed_at IS NOT NULL AND m.recipient IS NULL AND m.status != 'processed' "
    "AND (m.expires_at IS NULL OR m.expires_at > ?2)"
)


def send(conn: sqlite3.Connection, now: float, msg: NewMessage
         ) -> tuple[str, bool, float | None]:
    """Store a message; return (message_id, created, expires_at). A repeated `message_id`
    from the same sender to the same recipient returns created=False and the stored
    message's expires_at (a resend after a lost reply changes nothing).

    Raises:
        errors.BadRequest: the id is already taken by another sender or recipient.
    """
    cur = conn.execute(SQL_SEND, (msg.message_id, msg.sender, msg.recipient, msg.message_type,
                                  msg.content_json, msg.priority, msg.metadata_json, now,
                                  msg.expires_at))
    if cur.rowcount:
        return msg.message_id, True, msg.expires_at
    return resent(msg, conn.execute(SQL_MESSAGE_OWNER, (msg.message_id,)).fetchone())


def resent(msg: NewMessage, stored: tuple[str, str | None, float | None]
           ) -> tuple[str, bool, float | None]:
    """What `send` answers when `msg.message_id` is already stored as `stored` (sender,
    recipient, expires_at): the stored message, created=False. Pure (both stores).

    Raises:
        errors.BadRequest: the id is taken by another sender or recipient.
    """
    sender, recipient, expires_at = stored
    if (sender, recipient) != (msg.sender, msg.recipient):
        raise errors.BadRequest(f"message_id {msg.message_id} is already used by another message")
    return msg.message_id, False, expires_at


def ack(conn: sqlite3.Connection, now: float, reader: str, message_ids: list[str]) -> int:
    """Mark `reader`'s deliveries of `message_ids` processed; return how many changed.

    Ids this reader never received, already acked or already purged are skipped: an ack
    is idempotent, and a resent ack changes nothing.
    """
    n = 0
    for mid in message_ids:
        if conn.execute(SQL_ACK, (now, mid, reader)).rowcount:
            conn.execute(SQL_MARK_DIRECT, ("processed", now, mid))
            n += 1
    return n


def read(conn: sqlite3.Connection, now: float, reader: str, limit: int, visibility_s: float,
         ack_on_read: bool, take: Callable[[tuple[Any, ...]], bool]
         ) -> list[tuple[Any, ...]]:
    """Hand `reader` up to `limit` messages of its inbox and record the delivery.

    Each row is (message_id, sender, recipient, message_type, content JSON, priority,
    metadata JSON, created_at, expires_at, deliveries), `deliveries` counting this one.
    `take(row)` is asked in inbox order before each delivery; the first False ends the
    read (the caller's byte budget: what is not taken is not delivered). With
    `ack_on_read` the messages are processed at once (at most once); otherwise they are
    hidden from this reader for `visibility_s` and come back after it unless acked.
    """
    rows = conn.execute(SQL_INBOX, (reader, now, limit)).fetchall()
    out: list[tuple[Any, ...]] = []
    for found in rows:
        row = (*found[:9], found[9] + 1)
        if not take(row):
            break
        mid = row[0]
        done = now if ack_on_read else None
        conn.execute(SQL_DELIVER, (mid, reader, now, None if ack_on_read else now + visibility_s,
                                   done))
        conn.execute(SQL_MARK_DIRECT, ("processed" if ack_on_read else "delivered", done, mid))
        out.append(row)
    return out


def purge(conn: sqlite3.Connection, now: float, retention_cutoff: float,
          limit: int = PURGE_BATCH) -> int:
    """Delete up to `limit` messages each of: expired (`expires_at <= now`), processed
    before `retention_cutoff`, broadcasts created before it; return how many (their
    delivery rows go with them, ON DELETE CASCADE)."""
    n = conn.execute(SQL_PURGE_EXPIRED, (now, limit)).rowcount
    n += conn.execute(SQL_PURGE_PROCESSED, (retention_cutoff, limit)).rowcount
    n += conn.execute(SQL_PURGE_OLD_BROADCASTS, (retention_cutoff, limit)).rowcount
    return n


def update_agent(conn: sqlite3.Connection, now: float, name: str, status: str,
                 metadata_json: str | None) -> None:
    """Record an agent's status (a heartbeat); metadata None keeps the stored metadata."""
    conn.execute(SQL_AGENT_UPSERT, (name, status, metadata_json, now))


def agents(conn: sqlite3.Connection, now: float, name: str | None, after: str | None,
           limit: int) -> list[tuple[Any, ...]]:
    """(name, status, metadata JSON, heartbeat_at, first_seen_at, unread) for the agent
    `name`, or for up to `limit` agents named after `after`, by name.

    `unread` counts the messages `read` would still hand the agent, not yet acked: never
    delivered, or delivered and held within their visibility timeout. The work is one walk
    of the live broadcasts per call plus two index walks per agent (its direct messages,
    its acked broadcasts), not a scan of every broadcast per agent.
    """
    rows = conn.execute(SQL_AGENTS, (name, after, limit)).fetchall()
    if not rows:
        return []
    by_sender = dict(conn.execute(SQL_LIVE_BROADCASTS_BY_SENDER, (now,)).fetchall())
    live = sum(by_sender.values())
    out = []
    for row in rows:
        agent = row[0]
        direct = conn.execute(SQL_UNREAD_DIRECT, (agent, now)).fetchone()[0]
        acked = conn.execute(SQL_BROADCASTS_ACKED, (agent, now)).fetchone()[0]
        out.append((*row, direct + live - by_sender.get(agent, 0) - acked))
    return out


def purge_agents(conn: sqlite3.Connection, cutoff: float, limit: int = PURGE_BATCH) -> int:
    """Forget up to `limit` agents whose last status is older than `cutoff`; return how many
    (their messages stay: an agent that reports again finds its inbox)."""
    return conn.execute(SQL_AGENTS_PURGE, (cutoff, limit)).rowcount

