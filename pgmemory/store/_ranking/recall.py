"""The recall statement: what a provider injects (recent turns, then the mode's matches less
near-duplicates, within the token budget), chosen in one statement with its audit row.
"""

from __future__ import annotations

from functools import lru_cache

from pgmemory.store._engine.statement import builds, register
from pgmemory.store._ranking.audit import SIGNALS_JSON, audit_having
from pgmemory.store._ranking.budget import NEED, budget_stages
from pgmemory.store._ranking.scope import LIVE, READ_LIST, read_back, read_back_scoped, scope_where
from pgmemory.store._ranking.signals import explained_signals
from pgmemory.store._ranking.top import mode_ranking

# --- recall: what a provider injects, in one statement ----------------------------------------

#: A memory that records a tool call or result (not recalled unless asked for): a tool message,
#: one the provider marked so in its metadata (``"pgmemory.tool"``: ``"call"`` or ``"result"``),
#: or what a 0.2 provider stored for a call or a result without text.
_TOOL_MEMORY = """(m.role = 'tool'
           OR (m.metadata ->> 'pgmemory.tool') IS NOT NULL
           OR (m.role = 'assistant' AND (starts_with(m.content, '[called ')
                                         OR starts_with(m.content, '[tool result: '))))"""
#: A row the caller already shows the model (its message id is one of ``:exclude_message_ids``:
#: the session's history, the turn's input): never shown again. Tested only on the few rows a
#: recall may show (the walked and the recent ones), each against the whole list.
_SEEN = "({p}message_id IS NOT NULL AND {p}message_id = ANY(CAST(:exclude_message_ids AS text[])))"


def _near(a: str, b: str) -> str:
    """Whether two term sets (stripped tsvectors) overlap by ``:threshold`` or more (Jaccard):
    ``length`` counts a tsvector's distinct lexemes and ``||`` unites them, so with
    U = |A or B| the common terms are |A| + |B| - U, and (|A| + |B| - U) / U >= t reads
    |A| + |B| - U >= t U: one union a pair, no division. Two empty sets overlap by 1 (the
    second condition), an empty and a non-empty one by 0 (the inequality gives it)."""
    return f"""(length({a}) + length({b}) - length({a} || {b})
                 >= CAST(:threshold AS float8) * length({a} || {b})
             AND (length({a}) + length({b}) > 0 OR CAST(:threshold AS float8) <= 1))"""


#: No kept rows (a recall of no matches: ``max_results`` 0).
_NO_KEPT = """SELECT CAST(NULL AS bigint) AS rank, CAST(NULL AS uuid) AS id,
           CAST(NULL AS text) AS user_id, CAST(NULL AS real) AS score,
           CAST(NULL AS bigint) AS need
    WHERE false"""


def _walked_rows(dimensions: tuple[str, ...]) -> str:
    """The recall walk's read of each ranked row ``o`` (``walk_order``), as ``w``: its terms
    (``lexemes``), its line cost (``need``) and whether it may be shown (``showable``: not a
    tool memory, unless ``:include_tools``, and not a message the caller already shows,
    :data:`_SEEN`). In a user scope, one primary-key probe a row, made only when the walk gets
    to it (:func:`read_back`); without a user, a join."""

    def columns(p: str) -> str:  # of the row ``p`` names (``m.``, ``mm.``)
        return f"""strip({p}search_vector) AS lexemes, {NEED.format(p=p)} AS need,
               (CAST(:include_tools AS boolean) OR NOT {_TOOL_MEMORY.replace("m.", p)})
               AND NOT {_SEEN.format(p=p)} AS showable"""

    if "user_id" in dimensions:
        return read_back("o", columns("m."), routed=True, name="w")
    return f"""JOIN pgmemory_memories AS mm ON mm.id = o.id AND mm.user_id = o.user_id
    CROSS JOIN LATERAL (
        SELECT {columns("mm.")}
    ) AS w"""


@builds(fan_out="a recall of a scope without a user (session, agent or application)")
@lru_cache(maxsize=128)
def recall_memories(
    dimensions: tuple[str, ...],
    *,
    covering: bool,
    mode: str | None,
    fusion: str = "score",
    neighbours: bool = False,
    max_results: int = 3,
    audit: bool = True,
    relax_commit: bool = False,
    guarded: bool = False,
    distributed: bool = False,
) -> str:
    """What a provider injects, chosen in one statement, with its recall audit row.

    * ``recent``: the newest ``:recent_turns`` user messages of the scope and every message
      after them (at most ``:recent_rows`` rows), tool memories (:data:`_TOOL_MEMORY`) left
      out unless ``:include_tools``; those the caller already shows (:data:`_SEEN`) are not
      shown, but still count as recent (a match near one is a near-duplicate);
    * ``matches`` (unless ``mode`` is None: no query): the mode's best ``:limit`` rows
      (:func:`mode_ranking`, with :func:`explained_signals`), less the recent ones, tool memories and
      those the caller already shows, then
      walked in rank order keeping a row unless its term set (``search_vector``'s lexemes)
      overlaps a recent row's or a kept row's by ``:threshold`` or more (Jaccard), until
      ``max_results`` are kept (the statement's shape: one step per kept row);
    * the token budget (:func:`~pgmemory.store._ranking.budget.budget_stages`, its parameters
      from :func:`~pgmemory.store._ranking.budget.budget_parameters`), as
      :mod:`pgmemory.store.recall_text` renders it: each row's line capped at ``:item_cap``;
      the matches while they fit ``:half``, then the recent rows newest first while they fit
      ``:max_tokens``, then (when every recent row is shown) the further matches;
    * the audit row (unless ``audit`` is off) holds exactly the shown rows, in shown order,
      with their scores, reasons and signals, and ``:mode``; ``relax_commit`` and
      ``guarded`` as for :func:`~pgmemory.store._ranking.search.search_memories`.

    Returns the shown rows in shown order (related most relevant first, then recent oldest
    first): the memory, ``reason``, ``score``, ``cap`` and the signal columns.
    ``distributed`` as for :func:`~pgmemory.store._ranking.search.search_memories`.
    """
    where = scope_where(dimensions)
    ctes: list[str] = []
    if mode is not None:
        ctes.append(
            mode_ranking(
                dimensions,
                covering=covering,
                mode=mode,
                fusion=fusion,
                neighbours=neighbours,
                ann_dimensions=None,
                windowed=False,
                distributed=distributed,
            )
        )
        # The ranked rows in rank order, not read back: the walk below reads a row only when
        # it gets to it.
        ctes.append("""walk_order AS MATERIALIZED (
    SELECT t.id, t.user_id, t.score, row_number() OVER (ORDER BY t.score DESC, t.id) AS rank
    FROM top AS t
    WHERE t.score >= :min_score
)""")
    ctes.append(f"""latest AS MATERIALIZED (
    SELECT m.id, m.user_id, m.role, m.created_at, m.message_id,
           strip(m.search_vector) AS lexemes, {NEED.format(p="m.")} AS need
    FROM pgmemory_memories AS m
    WHERE {where}
      AND {LIVE}
      AND (CAST(:include_tools AS boolean) OR NOT {_TOOL_MEMORY})
    ORDER BY m.created_at DESC, m.id DESC
    LIMIT :recent_rows
)""")
    ctes.append(f"""recent AS MATERIALIZED (
    SELECT id, user_id, lexemes, need, pos, {_SEEN.format(p="")} AS seen
    FROM (
        SELECT l.*, row_number() OVER newest AS pos,
               count(*) FILTER (WHERE l.role = 'user') OVER newest
                   - CASE WHEN l.role = 'user' THEN 1 ELSE 0 END AS users_before
        FROM latest AS l
        WINDOW newest AS (ORDER BY l.created_at DESC, l.id DESC)
    ) AS w
    WHERE users_before < :recent_turns
)""")
    if mode is not None:
        walked = _walked_rows(dimensions)
        # The greedy walk, unrolled (Citus plans no recursive CTE beside a data-modifying
        # one): keep_k holds the first ranked row after keep_(k-1)'s that is no tool memory
        # (unless :include_tools), no recent row, near no recent row and near none of keep_1 ..
        # keep_(k-1), with its terms. Each step reads the rows it walks past, in rank order,
        # and stops at the one it keeps: a LIMIT 1 over a nested loop whose outer side comes
        # sorted (a subquery with its own ORDER BY and LIMIT, which the planner keeps whole;
        # over the CTE itself it sorted the loop's output, reading every row). A recall reads
        # the few rows before its matches, not all :limit ranked rows.
        for k in range(1, max_results + 1):
            after = f"(SELECT rank FROM keep_{k - 1})" if k > 1 else "0"
            against_kept = "".join(
                f"""
      AND NOT EXISTS (SELECT 1 FROM keep_{j} AS b WHERE {_near("w.lexemes", "b.lexemes")})"""
                for j in range(1, k)
            )
            near_recent = _near("w.lexemes", "r.lexemes")
            ctes.append(f"""keep_{k} AS MATERIALIZED (
    SELECT o.rank, o.id, o.user_id, o.score, w.need, w.lexemes
    FROM (SELECT * FROM walk_order WHERE rank > {after} ORDER BY rank LIMIT :limit) AS o
    {walked}
    WHERE w.showable
      AND NOT EXISTS (SELECT 1 FROM recent AS r WHERE r.id = o.id AND r.user_id = o.user_id)
      AND NOT EXISTS (SELECT 1 FROM recent AS r WHERE {near_recent}){against_kept}
    ORDER BY o.rank
    LIMIT 1
)""")
        kept = " UNION ALL ".join(
            f"SELECT rank, id, user_id, score, need FROM keep_{k}"
            for k in range(1, max_results + 1)
        )
        ctes.append(f"""matches AS MATERIALIZED (
    SELECT k.id, k.user_id, k.score, k.need, row_number() OVER (ORDER BY k.rank) AS ord
    FROM ({kept or _NO_KEPT}) AS k
)""")
        # The matches' own rows, for their signals (:func:`explained_signals` reads ``hits``).
        columns = "m.id, m.user_id, m.created_at, m.embedding"
        ctes.append(f"""hits AS (
    SELECT {columns}, x.score
    FROM matches AS x
    {read_back_scoped("x", columns, dimensions)}
)""")
        ctes.append(explained_signals(mode=mode, fusion=fusion))
    else:
        ctes.append("""matches AS (
    SELECT CAST(NULL AS uuid) AS id, CAST(NULL AS text) AS user_id, CAST(NULL AS real) AS score,
           CAST(NULL AS bigint) AS need, CAST(NULL AS bigint) AS ord
    WHERE false
)""")
    ctes += budget_stages()
    explained = (
        "LEFT JOIN explained AS e ON e.id = c.id AND e.user_id = c.user_id"
        if mode is not None
        else "LEFT JOIN (SELECT CAST(NULL AS uuid) AS id, CAST(NULL AS text) AS user_id, "
        "CAST(NULL AS float8) AS similarity, CAST(NULL AS float8) AS keywords, "
        "CAST(NULL AS float8) AS recency, CAST(NULL AS float8) AS neighbour, "
        "CAST(NULL AS text) AS reason) AS e ON false"
    )
    ctes.append(f"""chosen AS (
    SELECT id, user_id, ord AS place, cap, score FROM stage_a WHERE cap IS NOT NULL
    UNION ALL
    SELECT id, user_id, ord, cap, score FROM stage_c WHERE cap IS NOT NULL
    UNION ALL
    SELECT id, user_id, 1000000 + (SELECT count(*) FROM recent) - pos, cap, CAST(0 AS real)
    FROM stage_b WHERE cap IS NOT NULL
),
shown AS MATERIALIZED (
    SELECT c.id, c.user_id, c.cap, c.score, row_number() OVER (ORDER BY c.place) AS seq,
           CASE WHEN c.place >= 1000000 THEN 'recent' ELSE e.reason END AS reason,
           CASE WHEN c.place >= 1000000 THEN NULL ELSE e.similarity END AS similarity,
           CASE WHEN c.place >= 1000000 THEN NULL ELSE e.keywords END AS keywords,
           CASE WHEN c.place >= 1000000 THEN NULL ELSE e.recency END AS recency,
           CASE WHEN c.place >= 1000000 THEN NULL ELSE e.neighbour END AS neighbour
    FROM chosen AS c
    {explained}
)""")
    if audit:
        relax = audit_having(relax_commit=relax_commit, guarded=guarded)
        signals = SIGNALS_JSON.format(p="s.")
        ctes.append(f"""audit AS (
    INSERT INTO pgmemory_recall_audit
        (user_id, collection, application_id, agent_id, session_id, provider, mode,
         requesting_session_id, query_sha256, query_text, memory_ids, scores, reasons, signals)
    SELECT :audit_user_id, :collection, :audit_application_id, :audit_agent_id,
           :audit_session_id, :provider, :mode, :requesting_session_id,
           pgmemory_keyed_sha256(:audit_user_id, :query_sha256), :query_text,
           COALESCE(array_agg(s.id ORDER BY s.seq), '{{}}'),
           COALESCE(array_agg(s.score ORDER BY s.seq), '{{}}'),
           COALESCE(array_agg(s.reason ORDER BY s.seq), '{{}}'),
           COALESCE(jsonb_agg(CASE WHEN s.reason = 'recent' THEN NULL ELSE {signals} END
                              ORDER BY s.seq), '[]')
    FROM shown AS s{relax}
)""")
    body = ",\n".join(ctes)
    return f"""
WITH {body}
SELECT {READ_LIST}, s.reason, s.score, s.cap, s.similarity, s.keywords, s.recency,
       s.neighbour
FROM shown AS s
{read_back_scoped("s", READ_LIST, dimensions)}
ORDER BY s.seq
"""


register(__name__, globals())
