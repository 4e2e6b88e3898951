"""MemoryStore.recall: recent turns, matches with neighbours, near-duplicates dropped, tools left
out, the budget kept, in one statement with an audit row of exactly what was shown."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import text

from pgmemory import MemoryRecord, MemoryScope, MemoryStore, RecallTrace
from pgmemory.errors import InvalidInputError, ScopeError
from pgmemory.store import recall_text
from pgmemory.store._ranking import recall as ranking_recall
from pgmemory.text.tokens import estimate_tokens
from tests.conftest import unique

T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


def record(scope: MemoryScope, content: str, role: str, minute: int, **extra: Any) -> MemoryRecord:
    return MemoryRecord(
        content=content, scope=scope, role=role, created_at=T0 + timedelta(minutes=minute), **extra
    )


async def seed(store: MemoryStore, collection: str, scope: MemoryScope) -> None:
    old = MemoryScope(user_id=scope.user_id, session_id="s-old")
    new = MemoryScope(user_id=scope.user_id, session_id="s-new")
    await store.add(
        collection,
        [
            record(old, "Bob has a severe peanut allergy", "user", 0),
            record(old, "Noted: no peanuts for Bob.", "assistant", 1),
            record(old, "I ordered the green curry last time", "user", 2),
            record(old, "The green curry was from Thai Palace.", "assistant", 3),
            record(old, "Bob has a severe peanut allergy!", "user", 4),  # near-duplicate
            record(new, "What's on the menu tonight?", "user", 10),
            record(new, "[called GetMenu with {}]", "assistant", 11),
            record(new, "curry, noodles, soup", "tool", 12),
            record(new, "Tonight there is curry, noodles or soup.", "assistant", 13),
            record(new, "Order something for Bob and me", "user", 14),
            record(new, "Which dish would you like?", "assistant", 15),
        ],
    )


async def audit_rows(store: MemoryStore, user_id: str) -> list[dict[str, Any]]:
    async with store.engine.connect() as conn:
        rows = await conn.execute(
            text(
                "SELECT mode, provider, memory_ids, scores, reasons, signals "
                "FROM pgmemory_recall_audit WHERE user_id = :u ORDER BY id"
            ),
            {"u": user_id},
        )
        return [dict(r) for r in rows.mappings()]


async def test_recall_shows_recent_turns_and_matches_and_audits_exactly(
    store: MemoryStore, collection: str
) -> None:
    scope = MemoryScope(user_id=unique("u"))
    await seed(store, collection, scope)
    got = await store.recall(
        collection,
        scope,
        query="does Bob have any allergies?",
        heading="## Memories",
        trace=RecallTrace(provider="test", session_id="s-new"),
    )
    recent = [i.memory.content for i in got.items if i.reason == "recent"]
    # The two newest user turns and what followed them, oldest first, tools left out.
    assert recent == [
        "What's on the menu tonight?",
        "Tonight there is curry, noodles or soup.",
        "Order something for Bob and me",
        "Which dish would you like?",
    ]
    related = [i for i in got.items if i.reason != "recent"]
    contents = [i.memory.content for i in related]
    assert contents[0] == "Bob has a severe peanut allergy"
    # its near-duplicate is not shown, nor any tool memory
    assert "Bob has a severe peanut allergy!" not in contents
    assert not any(c.startswith("[called") or c == "curry, noodles, soup" for c in contents)
    assert len(related) <= 3
    for item in related:
        assert item.signals is not None and item.signals.similarity is not None
        assert item.reason in ("match", "neighbour")
    assert got.mode == "hybrid"
    assert got.text.startswith("## Memories\n" + recall_text.UNTRUSTED_NOTE)
    assert got.text.count("\n- ") == len(got.items)
    assert estimate_tokens(got.text) <= 2000
    [row] = await audit_rows(store, scope.user_id or "")
    assert row["memory_ids"] == got.memory_ids
    assert row["mode"] == "hybrid" and row["provider"] == "test"
    assert row["reasons"] == [i.reason for i in got.items]
    assert [s is None for s in row["signals"]] == [i.reason == "recent" for i in got.items]
    assert row["signals"][0]["similarity"] == pytest.approx(related[0].signals.similarity, abs=1e-4)


async def test_without_a_query_only_recent_turns(store: MemoryStore, collection: str) -> None:
    scope = MemoryScope(user_id=unique("u"))
    await seed(store, collection, scope)
    for query in (None, "", "   "):
        got = await store.recall(collection, scope, query=query, recent_turns=1)
        assert [i.memory.content for i in got.items] == [
            "Order something for Bob and me",
            "Which dish would you like?",
        ]
        assert got.mode == "recent"
    rows = await audit_rows(store, scope.user_id or "")
    assert [r["mode"] for r in rows] == ["recent"] * 3
    assert rows[0]["reasons"] == ["recent", "recent"]


async def test_include_tools(store: MemoryStore, collection: str) -> None:
    scope = MemoryScope(user_id=unique("u"))
    await seed(store, collection, scope)
    got = await store.recall(collection, scope, query=None, recent_turns=2, include_tools=True)
    contents = [i.memory.content for i in got.items]
    assert "[called GetMenu with {}]" in contents and "curry, noodles, soup" in contents


async def test_nothing_stored_still_audits_an_empty_recall(
    store: MemoryStore, collection: str
) -> None:
    scope = MemoryScope(user_id=unique("u"))
    got = await store.recall(collection, scope, query="anything")
    assert got.text == "" and got.items == [] and got.memory_ids == []
    [row] = await audit_rows(store, scope.user_id or "")
    assert row["memory_ids"] == [] and row["reasons"] == []


@pytest.mark.parametrize("mode", ["vector", "text", "hybrid"])
async def test_every_mode(store: MemoryStore, collection: str, mode: str) -> None:
    scope = MemoryScope(user_id=unique("u"))
    await seed(store, collection, scope)
    got = await store.recall(collection, scope, query="peanut allergy", mode=mode, recent_turns=0)
    assert got.items and got.items[0].memory.content.startswith("Bob has a severe peanut")
    assert got.mode == mode
    [row] = await audit_rows(store, scope.user_id or "")
    assert row["mode"] == mode


async def test_odd_and_huge_queries_never_kill_a_recall(
    store: MemoryStore, collection: str
) -> None:
    scope = MemoryScope(user_id=unique("u"))
    await seed(store, collection, scope)
    for query in ("\x00", "a\x00b' OR 1=1; --", "\ud800", "!!!", "💥" * 5000, "peanut " * 20000):
        for mode in ("hybrid", "text", "vector"):
            got = await store.recall(collection, scope, query=query, mode=mode)  # type: ignore[arg-type]
            assert estimate_tokens(got.text) <= 2000


async def test_the_budget_is_kept_and_long_memories_are_shortened(
    store: MemoryStore, collection: str
) -> None:
    scope = MemoryScope(user_id=unique("u"))
    rng = random.Random(7)
    words = ["peanut", "allergy", "curry", "Bob", "noodles", "spicy", "{", "\\", '"', "你好", "é"]
    records = []
    for i in range(30):
        body = " ".join(rng.choice(words) for _ in range(rng.choice([5, 50, 2000])))
        records.append(record(scope, f"{i} {body}", "user" if i % 2 == 0 else "assistant", i))
    await store.add(collection, records)
    for max_tokens in (1, 30, 60, 120, 300, 700, 2000, 20000):
        got = await store.recall(
            collection, scope, query="peanut allergy", max_tokens=max_tokens, heading="## M"
        )
        assert estimate_tokens(got.text) <= max_tokens, max_tokens
        rows = await audit_rows(store, scope.user_id or "")
        assert rows[-1]["memory_ids"] == got.memory_ids
        for item in got.items:
            assert item.line in got.text
    unbounded = await store.recall(collection, scope, query="peanut allergy", max_tokens=None)
    assert all(i.memory.content.replace("\\", "") for i in unbounded.items)
    assert "characters omitted" not in unbounded.text


async def test_bad_arguments_are_refused(store: MemoryStore, collection: str) -> None:
    scope = MemoryScope(user_id=unique("u"))
    with pytest.raises(ScopeError):
        await store.recall(collection, MemoryScope(), query="x")
    for kwargs in (
        {"max_results": -1},
        {"recent_turns": True},
        {"max_tokens": 0},
        {"mode": "fuzzy"},
        {"near_duplicate_threshold": float("nan")},
        {"include_tools": "yes"},
        {"query": 3},
    ):
        with pytest.raises(InvalidInputError):
            await store.recall(collection, scope, **kwargs)  # type: ignore[arg-type]


def test_a_shortened_line_always_fits_its_cap() -> None:
    """Property: for any content, role and cap >= MIN_LINE_TOKENS, the fitted line fits."""
    rng = random.Random(22)
    alphabet = ["a", "Z", " ", "1", "\n", "\x01", '"', "\\", "{", "你", "é", "💥", "\u2028", "-"]
    roles = ["system", "user", "assistant", "tool"]
    when = datetime(1, 1, 1, tzinfo=UTC)
    for _ in range(3000):
        length = rng.choice([0, 1, 10, 200, 5000, 40000])
        content = "".join(rng.choice(alphabet) for _ in range(length))
        role = rng.choice(roles)
        cap = rng.randint(recall_text.MIN_LINE_TOKENS, recall_text.MIN_LINE_TOKENS + 300)
        line = recall_text.fitted_line(when, role, content, cap)
        assert estimate_tokens(line) <= cap
        whole = recall_text.line(when, role, content)
        if estimate_tokens(whole) <= cap:
            assert line == whole
        # the stored estimate is the line's, whatever the time
        assert recall_text.line_tokens(role, content) == estimate_tokens(whole)


async def test_a_scope_without_a_user_and_the_sync_twin(
    store: MemoryStore, collection: str, store_url: str
) -> None:
    user = unique("u")
    await seed(store, collection, MemoryScope(user_id=user))
    session_only = MemoryScope(session_id="s-new")  # other tests' rows share it: only shape
    got = await store.recall(collection, session_only, query="menu", recent_turns=1)
    assert got.items and all(i.memory.scope.session_id == "s-new" for i in got.items)
    from pgmemory import SyncMemoryStore

    with SyncMemoryStore(store_url, embedder=store.embedder) as sync:
        twin = sync.recall(collection, MemoryScope(user_id=user), query="peanut allergy")
    assert twin.items[0].memory.content == "Bob has a severe peanut allergy"


async def test_the_near_duplicate_rule_is_the_jaccard_overlap_at_its_boundaries(
    store: MemoryStore,
) -> None:
    """The statement's near-duplicate test against the Jaccard overlap worked out in Python,
    over random term sets (empty ones too) and thresholds on and around the overlaps."""
    rng = random.Random(7)
    words = ["amber", "birch", "cedar", "dune", "elm", "fjord", "grove", "heath", "isle", "jade"]
    pairs = [
        (set(rng.sample(words, rng.randint(0, 6))), set(rng.sample(words, rng.randint(0, 6))))
        for _ in range(300)
    ]
    thresholds = [-0.5, 0.0, 0.25, 1 / 3, 0.5, 0.6, 2 / 3, 0.75, 0.9, 1.0, 1.01]
    cases = [(a, b, rng.choice(thresholds)) for a, b in pairs] + [
        (set(), set(), 1.0),  # two empty sets overlap by 1
        (set(), set(), 1.01),  # above 1 keeps them all
        (set(), {"elm"}, 0.0),
        (set(), {"elm"}, 0.01),
        ({"elm"}, {"elm"}, 1.0),
        ({"elm"}, {"elm"}, 1.01),
        ({"elm", "jade"}, {"elm", "isle"}, 1 / 3),  # exactly on the threshold
        ({"elm", "jade"}, {"elm", "isle"}, 0.34),
    ]
    near = ranking_recall._near("CAST(x.a AS tsvector)", "CAST(x.b AS tsvector)").replace(
        ":threshold", "x.t"
    )
    async with store.engine.connect() as conn:
        got = (
            (
                await conn.execute(
                    text(
                        f"SELECT {near} FROM unnest(CAST(:a AS text[]), CAST(:b AS text[]), "
                        "CAST(:t AS float8[])) WITH ORDINALITY AS x(a, b, t, i) ORDER BY x.i"
                    ),
                    {
                        "a": [" ".join(sorted(a)) for a, _, _ in cases],
                        "b": [" ".join(sorted(b)) for _, b, _ in cases],
                        "t": [t for _, _, t in cases],
                    },
                )
            )
            .scalars()
            .all()
        )
    want = [(len(a & b) / len(a | b) if a or b else 1.0) >= t for a, b, t in cases]
    assert got == want
    assert any(want) and not all(want)


@pytest.mark.parametrize(
    ("threshold", "include_tools"), [(0.9, False), (0.5, False), (0.5, True), (1.01, False)]
)
async def test_the_matches_are_the_first_ranked_rows_the_rules_keep(
    store: MemoryStore, collection: str, threshold: float, include_tools: bool
) -> None:
    """The recall's matches against the walk worked out in Python over the search's own
    ranking: rows are skipped (tools, recent rows, near-duplicates of recent or kept rows) deep
    into the ranking."""
    scope = MemoryScope(user_id=unique("u"))
    await seed(store, collection, scope)
    older = MemoryScope(user_id=scope.user_id, session_id="s-older")
    await store.add(
        collection,
        [
            record(older, f"Bob has a severe peanut allergy, note {i}", "user", -60 + i)
            for i in range(8)
        ]
        + [record(older, "peanut allergy card for Bob", "tool", -40 + i) for i in range(3)]
        + [
            record(older, "The peanut sauce at Thai Palace is mild", "assistant", -30),
            record(older, "Alice cannot eat shellfish", "user", -29),
            record(older, "An allergy test is booked for Friday", "user", -28),
        ],
    )
    query = "peanut allergy for Bob"
    got = await store.recall(
        collection,
        scope,
        query=query,
        max_results=3,
        max_tokens=None,
        near_duplicate_threshold=threshold,
        include_tools=include_tools,
        audit=False,
    )
    ranked = await store.search(
        collection, scope, query=query, mode="hybrid", limit=36, audit=False
    )
    ranked = [h for h in ranked if h.memory.role != "system"]
    async with store.engine.connect() as conn:
        rows = await conn.execute(
            text(
                "SELECT id, tsvector_to_array(search_vector) AS terms FROM pgmemory_memories "
                "WHERE user_id = :u"
            ),
            {"u": scope.user_id},
        )
        terms = {r.id: set(r.terms) for r in rows}

    def near(a: set[str], b: set[str]) -> bool:
        return (len(a & b) / len(a | b) if a or b else 1.0) >= threshold

    recent = [i.memory.id for i in got.items if i.reason == "recent"]
    kept: list[Any] = []
    for hit in ranked:
        memory = hit.memory
        tool = memory.role == "tool" or memory.content.startswith("[called ")
        if (tool and not include_tools) or memory.id in recent:
            continue
        if any(near(terms[memory.id], terms[other]) for other in recent + kept):
            continue
        kept.append(memory.id)
        if len(kept) == 3:
            break
    assert [i.memory.id for i in got.items if i.reason != "recent"] == kept
    assert len(kept) == 3


async def test_messages_the_caller_already_shows_are_not_recalled(
    store: MemoryStore, collection: str
) -> None:
    """``exclude_message_ids`` (the session's history, the input): such rows are shown neither
    as matches nor as recent turns, and the audit holds only what is shown; an excluded recent
    row still makes a match near it a near-duplicate; odd values are refused."""
    scope = MemoryScope(user_id=unique("u"))
    old = MemoryScope(user_id=scope.user_id, session_id="s-old")
    new = MemoryScope(user_id=scope.user_id, session_id="s-new")
    await store.add(
        collection,
        [
            record(old, "Bob has a severe peanut allergy", "user", 0, message_id="a"),
            record(old, "Bob is allergic to peanuts, noted", "assistant", 1, message_id="b"),
            record(old, "Alice loves green curry", "user", 2, message_id="c"),
            record(new, "Bob has a severe peanut allergy, remember", "user", 10, message_id="d"),
            record(new, "I will remember the peanut allergy", "assistant", 11, message_id="e"),
        ],
    )
    query = "what is Bob allergic to? peanut allergy"
    everything = await store.recall(collection, scope, query=query, max_tokens=None)
    assert {"d", "e"} <= {i.memory.message_id for i in everything.items if i.reason == "recent"}

    got = await store.recall(
        collection,
        scope,
        query=query,
        max_tokens=None,
        exclude_message_ids=["d", "e", "a", "not-stored", "", "x" * 300, "nul\x00", "\ud800"],
        trace=RecallTrace(provider="test"),
    )
    shown = [i.memory.message_id for i in got.items]
    assert not {"a", "d", "e"} & set(shown)
    assert "b" in shown  # the best match left
    [row] = [r for r in await audit_rows(store, scope.user_id or "") if r["provider"] == "test"]
    assert row["memory_ids"] == got.memory_ids
    # "d" is still a recent row: a match repeating it word for word is a near-duplicate.
    await store.add(
        collection, [record(old, "Bob has a severe peanut allergy, remember", "user", -5)]
    )
    again = await store.recall(
        collection, scope, query=query, max_tokens=None, exclude_message_ids=("d", "e")
    )
    assert "Bob has a severe peanut allergy, remember" not in [
        i.memory.content for i in again.items
    ]
    for bad in ("d", [1], None):
        with pytest.raises(InvalidInputError, match="exclude_message_ids"):
            await store.recall(collection, scope, query=query, exclude_message_ids=bad)  # type: ignore[arg-type]
