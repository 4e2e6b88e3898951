"""The recall audit row as part of a ranking statement, and the conditions an audited read
carries (the erasure guard, the relaxed commit): the row exists exactly when the read commits.
"""

from __future__ import annotations

#: A condition that is always true and lets the statement's transaction commit without waiting
#: for the disk flush (``synchronous_commit`` off, local to the transaction): for statements that
#: write nothing but recall-audit rows (memories always commit synchronously). Being part of
#: the statement, it costs no round trip of its own.
RELAX_COMMIT = "set_config('synchronous_commit', 'off', true) IS NOT NULL"

#: A condition that is true or raises: it takes the audited user's erasure lock (shared) and
#: refuses (SQLSTATE 40001) if an erasure of the user committed after the statement's snapshot
#: and before the lock was held (their audit secret's stamp, read by the statement, differs
#: from a fresh read: migration 0022). An audited read guarded so needs no lock statement
#: before it, on a server whose isolation is READ COMMITTED
#: (:attr:`pgmemory.store._engine.database.Database.guards_reads`).
ERASURE_GUARD = "pgmemory_erasure_guard(:audit_user_id, pgmemory_erasure_stamp(:audit_user_id))"


def audit_having(*, relax_commit: bool, guarded: bool) -> str:
    """The HAVING of an audit row's one-row step (no GROUP BY: it runs exactly once, with or
    without hits): :data:`ERASURE_GUARD` when ``guarded``, :data:`RELAX_COMMIT` when
    ``relax_commit``."""
    conditions = [c for c, on in ((ERASURE_GUARD, guarded), (RELAX_COMMIT, relax_commit)) if on]
    return f"\n    HAVING {' AND '.join(conditions)}" if conditions else ""


#: A shown row's signals as the recall audit keeps them: one JSON object, values rounded.
SIGNALS_JSON = """jsonb_build_object(
               'similarity', round(CAST({p}similarity AS numeric), 4),
               'keywords', round(CAST({p}keywords AS numeric), 4),
               'recency', round(CAST({p}recency AS numeric), 4),
               'neighbour', round(CAST({p}neighbour AS numeric), 4))"""


def recall_audit(*, relax_commit: bool, guarded: bool, explained: bool = False) -> str:
    """The ``audit`` CTE: the recall audit row of the hits, written in the same statement
    (with ``explained``, each hit's reason and signals too, from :func:`~pgmemory.store._ranking.signals.explained_signals`; with
    ``guarded``, :data:`ERASURE_GUARD`)."""
    relax = audit_having(relax_commit=relax_commit, guarded=guarded)
    order = "ORDER BY h.score DESC, h.id"
    columns = values = ""
    source = "hits AS h"
    if explained:
        columns = ", reasons, signals"
        values = f""",
           COALESCE(array_agg(e.reason {order}), '{{}}'),
           COALESCE(jsonb_agg({SIGNALS_JSON.format(p="e.")} {order}), '[]')"""
        source = "hits AS h JOIN explained AS e ON e.id = h.id AND e.user_id = h.user_id"
    return f""",
audit AS (
    INSERT INTO pgmemory_recall_audit
        (user_id, collection, application_id, agent_id, session_id, provider, mode,
         requesting_session_id, query_sha256, query_text, memory_ids, scores{columns})
    SELECT :audit_user_id, :collection, :audit_application_id, :audit_agent_id,
           :audit_session_id, :provider, :mode, :requesting_session_id,
           pgmemory_keyed_sha256(:audit_user_id, :query_sha256), :query_text,
           COALESCE(array_agg(h.id {order}), '{{}}'),
           COALESCE(array_agg(h.score {order}), '{{}}'){values}
    FROM {source}{relax}
)"""
