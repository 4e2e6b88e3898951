"""Reads and writes of a user take their locks in their own statements.

An audited search or recall writes its audit row under the user, so it holds the user's erasure
lock (shared) until it commits: an erasure either sees the row and moves it to the pseudonym,
or runs first. The lock used to be a statement of its own, sent before the read in the same
round trip, so that the read's snapshot was taken after the lock was held. That is a second
statement on every audited read (and, through psycopg, a pipeline around the two).

Here the read takes the lock itself, in its audit row's one-row step:

* ``pgmemory_erasure_stamp(user_id)``: the xmin of the user's audit secret, or NULL. Every
  stored memory's audit hash is keyed with that secret (created on the user's first one), an
  erasure deletes it with the memories, and a later write creates another; so a snapshot that
  holds any of the user's memories holds the secret that went with them. The function is
  STABLE: it reads the snapshot of the statement that calls it. It is the owner's (SECURITY
  DEFINER; the application role has no grant on the secrets), and it returns no secret.
* ``pgmemory_erasure_guard(user_id, seen)``: takes the user's erasure lock, shared (the same
  key the lock statement takes: class 1885826405, ``pgmemory.store.queries._ERASURE_LOCK_CLASS``,
  and ``hashtext(user_id)``), then reads the stamp again with a fresh snapshot (it is
  VOLATILE: under READ COMMITTED each of its queries takes a new one). If the statement saw a
  secret (``seen``) and it is gone or another now, an erasure committed after the statement's
  snapshot and before the lock was held: the statement may have read erased memories, so the
  function refuses (SQLSTATE 40001, ``pgmemory: the user was erased while this statement
  read``) and the read runs again (``pgmemory.store._engine.retry``). If the statement saw none, its
  snapshot holds no memory of the user to have been erased (a secret another statement
  created since changes nothing). Any later erasure waits for this statement's commit.

A chat-history append takes its locks the same way: ``pgmemory_history_tail(user_id,
session_id)`` takes the user's erasure lock (shared) and the session's append lock (exclusive,
key ``hashtextextended(session_id, hashtext(user_id))``, as the lock statement takes it), then
returns the session's last ``seq`` read with a fresh snapshot: the appends to one session take
turns, and each numbers its messages after what the one before it committed. (A memory insert
needs no function: it reads nothing its snapshot could have missed, and takes its users' erasure
locks with ``pg_advisory_xact_lock_shared`` before its first row.)

A statement under REPEATABLE READ or SERIALIZABLE gets no fresh snapshot in a function, and a
Citus cluster takes locks on the coordinator, so those keep the lock statement (the library
decides: ``Database.locks_in_statement``).

Roles that may already call ``pgmemory_keyed_sha256`` (an application role set up by
``pgmemory db roles``) are granted the new functions here, so they need no new setup.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-04
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_STAMP = """
CREATE FUNCTION pgmemory_erasure_stamp(p_user_id text) RETURNS text
LANGUAGE sql STABLE STRICT SECURITY DEFINER AS $$
    SELECT xmin::text FROM pgmemory_user_secrets WHERE user_id = p_user_id
$$
"""

_GUARD = """
CREATE FUNCTION pgmemory_erasure_guard(p_user_id text, p_seen text) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(1885826405, hashtext(p_user_id));
    IF p_seen IS NOT NULL AND pgmemory_erasure_stamp(p_user_id) IS DISTINCT FROM p_seen THEN
        RAISE EXCEPTION 'pgmemory: the user was erased while this statement read; run it again'
            USING ERRCODE = 'serialization_failure';
    END IF;
    RETURN true;
END
$$
"""

_TAIL = """
CREATE FUNCTION pgmemory_history_tail(p_user_id text, p_session_id text) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(1885826405, hashtext(p_user_id));
    PERFORM pg_advisory_xact_lock(hashtextextended(p_session_id, hashtext(p_user_id)));
    RETURN (
        SELECT COALESCE(max(seq), 0) FROM pgmemory_chat_messages
        WHERE user_id = p_user_id AND session_id = p_session_id
    );
END
$$
"""

_SIGNATURES = (
    "pgmemory_erasure_stamp(text)",
    "pgmemory_erasure_guard(text, text)",
    "pgmemory_history_tail(text, text)",
)

#: Grant the new functions to every role that may call pgmemory_keyed_sha256 (the owner and
#: PUBLIC aside: PUBLIC has no grant on it). The names come from the catalog, quoted there.
_GRANT_TO_CALLERS = """
DO $$
DECLARE
    r text;
BEGIN
    FOR r IN
        SELECT DISTINCT quote_ident(a.rolname)
        FROM pg_proc AS p, aclexplode(p.proacl) AS x
        JOIN pg_roles AS a ON a.oid = x.grantee
        WHERE p.oid = 'pgmemory_keyed_sha256(text, text)'::regprocedure
          AND x.privilege_type = 'EXECUTE' AND x.grantee <> p.proowner
    LOOP
        EXECUTE 'GRANT EXECUTE ON FUNCTION pgmemory_erasure_stamp(text), '
             || 'pgmemory_erasure_guard(text, text), pgmemory_history_tail(text, text) TO '
             || r;
    END LOOP;
END
$$
"""


def upgrade() -> None:
    """Create the stamp, the guard and the history tail, callable by the roles that audit
    already."""
    op.execute(_STAMP)
    op.execute(_GUARD)
    op.execute(_TAIL)
    for signature in _SIGNATURES:
        op.execute(f"REVOKE ALL ON FUNCTION {signature} FROM PUBLIC")
        # Only the schema's own objects, pg_temp last, as 0006 pinned its functions. The
        # schema name comes from the server, quoted there.
        op.execute(
            "DO $$ BEGIN EXECUTE format('ALTER FUNCTION "
            + signature
            + " SET search_path = %I, pg_temp', current_schema()); END $$"
        )
    op.execute(_GRANT_TO_CALLERS)


def downgrade() -> None:
    """Drop them (the library before this revision takes the locks in statements of their
    own)."""
    op.execute("DROP FUNCTION IF EXISTS pgmemory_history_tail(text, text)")
    op.execute("DROP FUNCTION IF EXISTS pgmemory_erasure_guard(text, text)")
    op.execute("DROP FUNCTION IF EXISTS pgmemory_erasure_stamp(text)")
