-- recall_audit(relax_commit=False, guarded=False, explained=False)
,
audit AS (
    INSERT INTO pgmemory_recall_audit
        (user_id, collection, application_id, agent_id, session_id, provider, mode,
         requesting_session_id, query_sha256, query_text, memory_ids, scores)
    SELECT :audit_user_id, :collection, :audit_application_id, :audit_agent_id,
           :audit_session_id, :provider, :mode, :requesting_session_id,
           pgmemory_keyed_sha256(:audit_user_id, :query_sha256), :query_text,
           COALESCE(array_agg(h.id ORDER BY h.score DESC, h.id), '{}'),
           COALESCE(array_agg(h.score ORDER BY h.score DESC, h.id), '{}')
    FROM hits AS h
)

-- recall_audit(relax_commit=True, guarded=True, explained=True)
,
audit AS (
    INSERT INTO pgmemory_recall_audit
        (user_id, collection, application_id, agent_id, session_id, provider, mode,
         requesting_session_id, query_sha256, query_text, memory_ids, scores, reasons, signals)
    SELECT :audit_user_id, :collection, :audit_application_id, :audit_agent_id,
           :audit_session_id, :provider, :mode, :requesting_session_id,
           pgmemory_keyed_sha256(:audit_user_id, :query_sha256), :query_text,
           COALESCE(array_agg(h.id ORDER BY h.score DESC, h.id), '{}'),
           COALESCE(array_agg(h.score ORDER BY h.score DESC, h.id), '{}'),
           COALESCE(array_agg(e.reason ORDER BY h.score DESC, h.id), '{}'),
           COALESCE(jsonb_agg(jsonb_build_object(
               'similarity', round(CAST(e.similarity AS numeric), 4),
               'keywords', round(CAST(e.keywords AS numeric), 4),
               'recency', round(CAST(e.recency AS numeric), 4),
               'neighbour', round(CAST(e.neighbour AS numeric), 4)) ORDER BY h.score DESC, h.id), '[]')
    FROM hits AS h JOIN explained AS e ON e.id = h.id AND e.user_id = h.user_id
    HAVING pgmemory_erasure_guard(:audit_user_id, pgmemory_erasure_stamp(:audit_user_id)) AND set_config('synchronous_commit', 'off', true) IS NOT NULL
)

