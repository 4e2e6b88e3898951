-- scope_where(user)
m.collection = :collection
      AND m.user_id = :user_id

-- scope_where(user, session)
m.collection = :collection
      AND m.user_id = :user_id
      AND m.session_id = :session_id

-- scope_and_window(agent, windowed)
m.collection = :collection
      AND m.agent_id = :agent_id

      AND m.created_at >= :since AND m.created_at < :until

-- read_back(routed)
CROSS JOIN LATERAL (
        SELECT m.id
        FROM pgmemory_memories AS m
        WHERE m.id = t.id AND m.user_id = t.user_id
          AND m.user_id = :user_id
        OFFSET 0
    ) AS m

-- read_back_scoped(session)
JOIN pgmemory_memories AS m ON m.id = t.id AND m.user_id = t.user_id

