"""The hub on PostgreSQL (coordd.store.api_hub.HubStore): its statements and the mixin
PostgresStore inherits. The rules are coordd.service.hub's; the time is the database's (`NOW`).

A reader's read and ack run under a transaction advisory lock on its name, so two calls
of one reader never hand out the same message or undo an ack (SQLite's single writer
serialises them). Lock order, to stay free of deadlocks: the reader's advisory lock, then
the message rows (FOR KEY SHARE: readers of a broadcast share it; a purge cannot delete a
message being delivered), then the reader's `message_reads` rows; the purge never waits
for a message row (FOR UPDATE SKIP LOCKED).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from coordd.rules.hub_views import ReadBudget, agent_view
from coordd.wire.protocol import AgentView, ReadResult, SendResult
from coordd.store import messages as msg_store
from coordd.store.postgres.sql import NOW

SQL_READER_LOCK = (  # $2 reader; returns the transaction's NOW
    f"SELECT {NOW}, pg_advisory_xact_lock(hashtext('coordd-hub'), hashtext($2))"
)
SQL_SEND = (  # $2 id, $3 sender, $4 recipient, $5 type, $6 content, $7 priority, $8 metadata,
    # $9 ttl_s
    "INSERT INTO messages (message_id, sender, recipient, message_type, content, priority, "
    f"metadata, status, created_at, expires_at) VALUES ($2, $3, $4, $5, $6, $7, $8, 'pending', "
    f"{NOW}, {NOW} + $9::float8) ON CONFLICT (message_id) DO NOTHING RETURNING expires_at"
)
SQL_MESSAGE_OWNER = "SELECT sender, recipient, expires_at FROM messages WHERE message_id = $1"
_LIVE = f"(m.expires_at IS NULL OR m.expires_at > {NOW})"
# A reader's inbox, as coordd.store.messages.SQL_INBOX: its direct messages not yet
# processed plus broadcasts by others, live, not acked by it, not held by a delivery
# inside its visibility timeout; P0 first, then oldest ($2 reader, $3 limit).
SQL_INBOX = (
    "SELECT m.message_id, m.sender, m.recipient, m.message_type, m.content, m.priority, "
    "m.metadata, m.created_at, m.expires_at, coalesce(r.deliveries, 0) FROM messages m "
    "LEFT JOIN message_reads r ON r.message_id = m.message_id AND r.reader = $2 "
    "WHERE m.status <> 'processed' AND (m.recipient = $2 OR (m.recipient IS NULL "
    f"AND m.sender <> $2)) AND {_LIVE} AND r.processed_at IS NULL "
    f"AND (r.visible_at IS NULL OR r.visible_at <= {NOW}) "
    "ORDER BY m.priority, m.created_at, m.seq LIMIT $3 FOR KEY SHARE OF m"
)
SQL_DELIVER = (  # $2 reader, $3 message ids, $4 visibility_s, $5 ack_on_read
    "WITH d AS (INSERT INTO message_reads (message_id, reader, deliveries, delivered_at, "
    f"visible_at, processed_at) SELECT id, $2, 1, {NOW}, CASE WHEN $5::boolean THEN NULL "
    f"ELSE {NOW} + $4::float8 END, CASE WHEN $5::boolean THEN {NOW} END "
    "FROM unnest($3::text[]) AS id ON CONFLICT (message_id, reader) DO UPDATE SET "
    "deliveries = message_reads.deliveries + 1, delivered_at = excluded.delivered_at, "
    "visible_at = excluded.visible_at, processed_at = excluded.processed_at) "
    "UPDATE messages SET status = CASE WHEN $5::boolean THEN 'processed' ELSE 'delivered' "
    f"END, processed_at = CASE WHEN $5::boolean THEN {NOW} END "
    "WHERE message_id = ANY($3::text[]) AND recipient IS NOT NULL AND status <> 'processed'"
)
SQL_ACK = (  # $2 reader, $3 message ids; the message rows are locked first (lock order)
    "WITH k AS (SELECT message_id FROM messages WHERE message_id = ANY($3::text[]) "
    "FOR KEY SHARE), "
    f"a AS (UPDATE message_reads SET processed_at = {NOW}, visible_at = NULL "
    "WHERE reader = $2 AND message_id IN (SELECT message_id FROM k) "
    "AND processed_at IS NULL RETURNING message_id), "
    f"m AS (UPDATE messages SET status = 'processed', processed_at = {NOW} FROM a "
    "WHERE messages.message_id = a.message_id AND messages.recipient IS NOT NULL "
    "AND messages.status <> 'processed') "
    "SELECT count(*) FROM a"
)
SQL_AGENT_UPSERT = (  # $2 name, $3 status, $4 metadata (NULL: keep)
    "INSERT INTO agents (name, status, metadata, heartbeat_at, first_seen_at) "
    f"VALUES ($2, $3, $4, {NOW}, {NOW}) ON CONFLICT (name) DO UPDATE SET "
    "status = excluded.status, metadata = coalesce(excluded.metadata, agents.metadata), "
    "heartbeat_at = excluded.heartbeat_at"
)
# A page of agents by name ($2 name, $3 after, $4 limit) with `unread` counted as
# coordd.store.messages.agents does: direct messages not processed, plus live broadcasts,
# less those the agent sent, less those it acked; one snapshot, then NOW.
SQL_AGENTS = (
    "WITH a AS (SELECT name, status, metadata, heartbeat_at, first_seen_at FROM agents "
    "WHERE ($2::text IS NULL OR name = $2) AND ($3::text IS NULL OR name > $3) "
    "ORDER BY name LIMIT $4), "
    "b AS (SELECT m.sender, count(*) AS n FROM messages m WHERE m.recipient IS NULL "
    f"AND m.status <> 'processed' AND {_LIVE} GROUP BY m.sender) "
    "SELECT a.name, a.status, a.metadata, a.heartbeat_at, a.first_seen_at, "
    "((SELECT count(*) FROM messages m WHERE m.recipient = a.name "
    f"AND m.status <> 'processed' AND {_LIVE}) "
    "+ coalesce((SELECT sum(n) FROM b), 0) "
    "- coalesce((SELECT n FROM b WHERE b.sender = a.name), 0) "
    "- (SELECT count(*) FROM message_reads r JOIN messages m ON m.message_id = r.message_id "
    "WHERE r.reader = a.name AND r.processed_at IS NOT NULL AND m.recipient IS NULL "
    f"AND m.status <> 'processed' AND {_LIVE}))::bigint, {NOW} "
    "FROM a ORDER BY a.name"
)
_PURGE = ("WITH d AS (DELETE FROM messages WHERE message_id IN (SELECT message_id "
          "FROM messages m WHERE {} LIMIT $2 FOR UPDATE SKIP LOCKED) RETURNING 1) "
          "SELECT count(*) FROM d")
# $2 batch, $3 retention_s: expired, processed before the cutoff, broadcasts sent before it
SQL_PURGE_EXPIRED = _PURGE.format(f"m.expires_at <= {NOW} AND $3::float8 IS NOT NULL")
SQL_PURGE_PROCESSED = _PURGE.format(f"m.processed_at < {NOW} - $3::float8")
SQL_PURGE_OLD_BROADCASTS = _PURGE.format(
    f"m.recipient IS NULL AND m.created_at < {NOW} - $3::float8")
SQL_PURGE_AGENTS = (  # $2 retention_s, $3 batch
    "WITH d AS (DELETE FROM agents WHERE name IN (SELECT name FROM agents "
    f"WHERE heartbeat_at < {NOW} - $2::float8 LIMIT $3 FOR UPDATE SKIP LOCKED) RETURNING 1) "
    "SELECT count(*) FROM d"
)

SEND_TRIES = 3  # a resend whose stored twin is purged between two statements inserts again


class HubOps:
    """HubStore over PostgresStore's pool (`self._conn()`); see the module docstring."""

    _conn: Any

    async def send_message(self, msg: msg_store.NewMessage, ttl_s: float | None, *,
                           now: float | None = None) -> SendResult:
        """Store a message (ON CONFLICT on its id: a resend is the stored one).
        Raises: errors.BadRequest (coordd.store.messages.resent)."""
        async with self._conn() as conn:
            for _ in range(SEND_TRIES):
                row = await conn.fetchrow(SQL_SEND, now, msg.message_id, msg.sender,
                                          msg.recipient, msg.message_type, msg.content_json,
                                          msg.priority, msg.metadata_json, ttl_s)
                if row is not None:
                    return SendResult(message_id=msg.message_id, created=True,
                                      expires_at=row[0])
                stored = await conn.fetchrow(SQL_MESSAGE_OWNER, msg.message_id)
                if stored is not None:
                    mid, created, expires_at = msg_store.resent(msg, tuple(stored))
                    return SendResult(message_id=mid, created=created, expires_at=expires_at)
        raise RuntimeError(f"message {msg.message_id}: neither stored nor found")

    async def read_messages(self, reader: str, limit: int, visibility_s: float,
                            ack_on_read: bool, ack: Sequence[str], frame_bytes: int, *,
                            now: float | None = None) -> ReadResult:
        """Ack, then deliver within coordd.rules.hub_views.ReadBudget, in one transaction under
        the reader's lock. Raises: errors.PayloadTooLarge (nothing acked or delivered)."""
        budget = ReadBudget(frame_bytes)
        async with self._conn() as conn, conn.transaction():
            t = (await conn.fetchrow(SQL_READER_LOCK, now, reader))[0]
            acked = await conn.fetchval(SQL_ACK, now, reader, list(ack)) if ack else 0
            ids = []
            for found in await conn.fetch(SQL_INBOX, now, reader, limit):
                if not budget.take((*tuple(found)[:9], found[9] + 1)):
                    break
                ids.append(found[0])
            if ids:
                await conn.execute(SQL_DELIVER, now, reader, ids, visibility_s, ack_on_read)
        return ReadResult(messages=budget.views, acked=acked,
                          visible_until=None if ack_on_read or not ids else t + visibility_s)

    async def ack_messages(self, reader: str, message_ids: Sequence[str], *,
                           now: float | None = None) -> int:
        """Mark the reader's deliveries processed, under the reader's lock."""
        if not message_ids:
            return 0
        async with self._conn() as conn, conn.transaction():
            await conn.fetchrow(SQL_READER_LOCK, now, reader)
            return await conn.fetchval(SQL_ACK, now, reader, list(message_ids))

    async def update_agent(self, name: str, status: str, metadata_json: str | None, *,
                           now: float | None = None) -> None:
        """Record an agent's status on the database's clock."""
        async with self._conn() as conn:
            await conn.execute(SQL_AGENT_UPSERT, now, name, status, metadata_json)

    async def agents(self, name: str | None, after: str | None, limit: int, stale_s: float,
                     *, now: float | None = None) -> list[AgentView]:
        """A page of agents with liveness and unread counts at the database's now."""
        async with self._conn() as conn:
            rows = await conn.fetch(SQL_AGENTS, now, name, after, limit)
        return [agent_view(tuple(r)[:6], r[6], stale_s) for r in rows]

    async def purge_messages(self, retention_s: float, *, now: float | None = None) -> int:
        """One batch each of expired, processed and old broadcast messages (their
        deliveries go with them, ON DELETE CASCADE); rows a reader holds are skipped."""
        n = 0
        async with self._conn() as conn, conn.transaction():
            for stmt in (SQL_PURGE_EXPIRED, SQL_PURGE_PROCESSED, SQL_PURGE_OLD_BROADCASTS):
                n += await conn.fetchval(stmt, now, msg_store.PURGE_BATCH, retention_s)
        return n

    async def purge_agents(self, retention_s: float, *, now: float | None = None) -> int:
        """Forget one batch of agents not heard from for `retention_s`."""
        async with self._conn() as conn:
            return await conn.fetchval(SQL_PURGE_AGENTS, now, retention_s,
                                       msg_store.PURGE_BATCH)
