"""The bad-input matrix, store side: no user input kills a turn, and no error repeats it.

Each row is a case the red team found. Free text (contents, queries, metadata, facts, history)
is normalised by :mod:`pgmemory.text.clean` and stored; ids are refused with a clear
:class:`InvalidInputError` before any SQL, never a raw driver error; no message carries the
text or the id that caused it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from pgmemory.admin import Admin
from pgmemory.errors import DatabaseNotReadyError, InvalidInputError, ScopeError
from pgmemory.settings import Settings
from pgmemory.store import migrate, validation
from pgmemory.store.records import MemoryRecord, MemoryScope, RecallTrace
from pgmemory.store.store import MemoryStore
from pgmemory.text.clean import MAX_JSON_DEPTH, clean_query, clean_text
from tests.conftest import unique

#: A marker that must never show up in an error message.
SECRET = "SECRET-diabetes-4711"
LITERAL_NUL = "\\u0000"  # six printable characters: a backslash, 'u' and four zeros
HALF_EMOJI = json.loads('"half \\ud83d emoji"')  # what json.loads gives for half a pair
LINE_SEPARATORS = "line\u2028separator\u2029paragraph"


def vector(dimensions: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(dimensions).astype(np.float32)


async def _memory_rows(store: MemoryStore, collection: str) -> int:
    async with store.engine.connect() as conn:
        return int(
            (
                await conn.execute(
                    text("SELECT count(*) FROM pgmemory_memories WHERE collection = :c"),
                    {"c": collection},
                )
            ).scalar_one()
        )


async def _refused(
    call: Callable[[], Awaitable[Any]], *, match: str, error: type[Exception] = InvalidInputError
) -> InvalidInputError:
    """The call raises ``error`` matching ``match``, and the message carries no secret."""
    with pytest.raises(error, match=match) as info:
        await call()
    assert SECRET not in str(info.value)
    assert isinstance(info.value, InvalidInputError)
    return info.value


# --- long recall queries ---------------------------------------------------------------------


@pytest.mark.parametrize("query", ["x " * 20_000, "a" * 20_000 + "\n" + "b" * 20_000])
async def test_a_query_over_the_text_limit_is_cut_not_refused(
    store: MemoryStore, collection: str, query: str, owner_engine: AsyncEngine
) -> None:
    user = unique("u")
    await store.add(
        collection, [MemoryRecord(content="aaaa bbbb", scope=MemoryScope(user_id=user))]
    )
    assert len(query) > store.settings.max_text_chars
    hits = await store.search(
        collection,
        MemoryScope(user_id=user),
        query=query,
        mode="text",
        trace=RecallTrace(include_query_text=True),
    )
    assert isinstance(hits, list)
    # The audit row keeps what was searched: the cleaned head of max_text_chars characters.
    used = clean_query(query, max_chars=store.settings.max_text_chars)
    assert len(used) == store.settings.max_text_chars
    async with store.engine.connect() as conn:
        row = (
            await conn.execute(
                text(
                    "SELECT query_sha256, length(query_text) FROM pgmemory_recall_audit "
                    "WHERE user_id = :u ORDER BY id DESC LIMIT 1"
                ),
                {"u": user},
            )
        ).one()
    async with owner_engine.connect() as conn:  # the secrets are the owner's to read
        secret = (
            await conn.execute(
                text("SELECT secret FROM pgmemory_user_secrets WHERE user_id = :u"), {"u": user}
            )
        ).scalar_one()
    # The audit's query hash is keyed with the user's secret (see the README's Security section).
    keyed = hashlib.sha256(secret + hashlib.sha256(used.encode()).digest()).hexdigest()
    assert row == (keyed, store.settings.max_text_chars)


async def test_a_long_query_is_embedded_from_its_head(
    database_url: str, embedder, collection: str
) -> None:
    settings = Settings(_env_file=None, max_text_chars=40)  # type: ignore[call-arg]
    user = unique("u")
    async with MemoryStore(database_url, settings=settings, embedder=embedder) as small:
        await small.add(
            collection, [MemoryRecord(content="spicy food", scope=MemoryScope(user_id=user))]
        )
        for mode in ("vector", "hybrid"):
            hits = await small.search(
                collection, MemoryScope(user_id=user), query="spicy " * 100, mode=mode
            )
            assert [h.memory.content for h in hits] == ["spicy food"]


# --- NUL, the printable \u0000, lone surrogates, U+2028/U+2029 --------------------------------


@pytest.mark.parametrize(
    ("given", "stored"),
    [
        ("before\x00after", "before\ufffdafter"),
        (LITERAL_NUL + " is just text", LITERAL_NUL + " is just text"),
        (HALF_EMOJI, "half \ufffd emoji"),
        ("\ud83d\ude00 joined pair", "\U0001f600 joined pair"),
        (LINE_SEPARATORS, LINE_SEPARATORS),
    ],
    ids=["nul", "printable-backslash-u0000", "lone-surrogate", "split-pair", "u2028-u2029"],
)
async def test_odd_characters_are_stored_and_searched_everywhere(
    store: MemoryStore, collection: str, given: str, stored: str
) -> None:
    assert clean_text(given) == stored
    user = unique("u")
    scope = MemoryScope(user_id=user)
    metadata = {"note": given, given: [given, {"deeper": given}]}
    await store.add(
        collection,
        [
            MemoryRecord(
                content=given, scope=scope, author_name=given, message_id="m1", metadata=metadata
            )
        ],
    )
    [memory] = await store.list(collection, scope)
    assert memory.content == stored and memory.author_name == stored
    assert memory.metadata == {"note": stored, stored: [stored, {"deeper": stored}]}
    for mode in ("vector", "text", "hybrid"):
        hits = await store.search(
            collection, scope, query=given, mode=mode, trace=RecallTrace(include_query_text=True)
        )
        assert [h.memory.id for h in hits] == [memory.id] or mode == "text"
    await store.record_recall(
        collection, scope, memory_ids=[memory.id], scores=[1.0], query=given,
        trace=RecallTrace(include_query_text=True),
    )  # fmt: skip
    session = unique("s")
    message = {"message_id": "m1", "role": "user", "text": given, "extra": {given: given}}
    assert await store.append_history(session, [message], user_id=user) == 1
    [row] = await store.read_history(session, user_id=user)
    assert row.message == {
        "message_id": "m1",
        "role": "user",
        "text": stored,
        "extra": {stored: stored},
    }
    facts = await store.merge_facts("profile", scope, {"says": given, given: 1})
    assert facts == {"says": stored, stored: 1}
    assert await store.get_facts("profile", scope) == facts


@pytest.mark.parametrize(
    "bad_id", ["a\x00b", json.loads('"a\\ud83d"')], ids=["nul", "lone-surrogate"]
)
async def test_an_id_with_nul_or_a_lone_surrogate_is_refused_not_rewritten(
    store: MemoryStore, collection: str, bad_id: str
) -> None:
    with pytest.raises(ScopeError, match="user_id contains"):
        MemoryScope(user_id=bad_id)
    scope = MemoryScope(user_id=unique("u"))
    await _refused(
        lambda: store.add(collection, [MemoryRecord(content="x", scope=scope, message_id=bad_id)]),
        match=r"records\[0\]\.message_id contains .* at index 1",
    )
    await _refused(
        lambda: store.append_history(bad_id, [{"message_id": "m", "role": "user"}]),
        match="session_id contains",
    )
    await _refused(
        lambda: store.append_history("s", [{"message_id": bad_id, "role": "user"}]),
        match=r"messages\[0\]\.message_id contains",
    )
    await _refused(lambda: store.merge_facts(bad_id, scope, {"a": 1}), match="namespace contains")
    with pytest.raises(InvalidInputError, match="RecallTrace.session_id contains"):
        RecallTrace(session_id=bad_id)


# --- ids within 256 characters that overflow an index entry ----------------------------------


@pytest.mark.parametrize("dimensions", [512, 640])
async def test_email_and_hex_session_fit_beside_the_vector(
    store: MemoryStore, dimensions: int
) -> None:
    # At 640 dimensions the covering entry once left ~90 bytes for the ids: this was refused.
    name = unique(f"c{dimensions}")
    await store.create_collection(name, dimensions=dimensions, embedding_model="test")
    email, session = "alice.smith@example.com", hashlib.sha256(b"s").hexdigest()
    scope = MemoryScope(user_id=email, session_id=session)
    await store.add(name, [MemoryRecord(content="x", scope=scope, embedding=vector(dimensions))])
    assert [m.scope for m in await store.list(name, scope)] == [scope]


async def test_ids_too_long_for_the_covering_entry_are_refused_by_name(store: MemoryStore) -> None:
    name = unique("c512")
    await store.create_collection(name, dimensions=512, embedding_model="test")
    cjk = "用" * 256  # 768 bytes: more than the ~600 the 512-d covering entry leaves
    good = MemoryRecord(content="fits", scope=MemoryScope(user_id="bob"), embedding=vector(512))
    bad = MemoryRecord(content="x", scope=MemoryScope(user_id=cjk), embedding=vector(512))
    error = await _refused(
        lambda: store.add(name, [good, bad]),
        match=r"records\[1\]: the collection name \(\d+ bytes\), scope.user_id \(768 bytes\) "
        r"make an entry of 2,\d{3} bytes in the index "
        r"ix_pgmemory_memories_user_cover beside the 512-dimension vector",
    )
    assert cjk not in str(error)
    assert await _memory_rows(store, name) == 0  # the whole batch is refused, before any SQL


async def _check_exact_at_the_limit(
    store: MemoryStore, dimensions: int, index: validation.IndexShape, name: str, agent: str
) -> None:
    """The largest entry of ``index`` the check lets through is stored, one byte more is
    refused by the check (not by the server), naming the index."""
    await store.create_collection(name, dimensions=dimensions, embedding_model="test")
    values = {"collection": name, "session_id": "", "agent_id": agent, "application_id": "",
              "embedding": dimensions, "user_id": ""}  # fmt: skip
    fitting = next(
        n for n in range(256, 0, -1)
        if validation.entry_bytes(index, values | {"user_id": "u" * n})
        <= validation.BTREE_MAX_ENTRY_BYTES
    )  # fmt: skip
    assert fitting < 256  # the limit is reached within the id length limit

    def record(n: int) -> MemoryRecord:
        return MemoryRecord(
            content="x",
            scope=MemoryScope(user_id="u" * n, agent_id=agent or None),
            embedding=vector(dimensions),
        )

    # PostgreSQL takes the largest entry the check lets through (no ProgramLimitExceeded) ...
    await store.add(name, [record(fitting)])
    # ... and one more byte is refused by the check, not by the server.
    await _refused(lambda: store.add(name, [record(fitting + 1)]), match=index.name)
    assert await _memory_rows(store, name) == 1


async def test_the_index_entry_check_is_exact_at_the_limit(store: MemoryStore) -> None:
    """The covering index beside a 512-d vector (a long agent id takes room there)."""
    agent = "用" * 150  # 450 bytes, so that the user id crosses the limit within 256 characters
    await _check_exact_at_the_limit(store, 512, validation.COVERING_INDEX, unique("c512"), agent)


async def test_the_half_vectors_entry_check_is_exact_at_the_limit(fresh_database: str) -> None:
    """Where the memories keep half vectors: their index beside 1,024 halves (a long
    collection name takes room there). Ids stored before that do not fit it make adding the
    half vectors fail, naming the fix, with nothing changed."""
    migrate.upgrade(fresh_database)
    # ids PostgreSQL cannot compress in the entry: 150 random CJK characters (450 bytes) and
    # 256 random letters
    rng = np.random.default_rng(8)
    name = "".join(chr(0x4E00 + int(k)) for k in rng.integers(0, 20_000, 150))
    user = "".join(chr(ord("a") + int(k)) for k in rng.integers(0, 26, 256))
    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    async with MemoryStore(fresh_database, settings=settings) as plain:
        await plain.create_collection(name, dimensions=1024, embedding_model="test")
        long = MemoryScope(user_id=user)
        await plain.add(name, [MemoryRecord(content="x", scope=long, embedding=vector(1024))])
        with pytest.raises(DatabaseNotReadyError, match="ix_pgmemory_memories_user_halves") as e:
            await Admin(plain).add_half_vectors()
        assert user[:20] not in str(e.value) and "nothing was changed" in str(e.value)
        assert plain._db.first_passes == ("codes",)
        await plain.delete(name, scope=long)
        assert (await Admin(plain).add_half_vectors()).added
        assert plain._db.first_passes == ("codes", "halves")
    async with MemoryStore(fresh_database, settings=settings) as store:
        await _check_exact_at_the_limit(
            store, 1024, validation.HALVES_INDEX, unique("c") + "用" * 150, ""
        )


async def test_256_character_cjk_ids(store: MemoryStore) -> None:
    name = unique("c700")  # above 512 dimensions: no covering index
    await store.create_collection(name, dimensions=700, embedding_model="test")
    cjk = "用" * 256  # 768 bytes
    scope = MemoryScope(user_id=cjk, session_id=cjk, agent_id=cjk, application_id=cjk)
    # Without a message id every entry fits: stored.
    await store.add(name, [MemoryRecord(content="x", scope=scope, embedding=vector(700))])
    assert [m.scope for m in await store.list(name, scope)] == [scope]
    # With one, the unique message index would hold six texts: refused, naming it.
    await _refused(
        lambda: store.add(
            name, [MemoryRecord(content="y", scope=scope, message_id=cjk, embedding=vector(700))]
        ),
        match=r"records\[0\]: .*scope.user_id \(768 bytes\).*message_id \(768 bytes\) make an entry "
        r"of 3,\d{3} bytes in the index uq_pgmemory_memories_message",
    )
    assert await _memory_rows(store, name) == 1


async def test_256_emoji_ids_in_history_and_facts(store: MemoryStore) -> None:
    emoji = "\U0001f600" * 256  # 1,024 bytes
    await _refused(
        lambda: store.append_history(emoji, [{"message_id": emoji, "role": "user"}], user_id=emoji),
        match=r"messages\[0\]: .*make an entry of 3,\d{3} bytes in the index uq_pgmemory_chat_messages_message",
    )
    assert await store.count_history(emoji, user_id=emoji) == 0
    # Two of them fit one entry (user and session id): stored.
    assert (
        await store.append_history(emoji, [{"message_id": "m", "role": "user"}], user_id=emoji) == 1
    )
    scope = MemoryScope(user_id=emoji, session_id=emoji, agent_id=emoji)
    await _refused(
        lambda: store.merge_facts("profile", scope, {"a": 1}),
        match=r"facts: scope.user_id \(1,024 bytes\), scope.agent_id \(1,024 bytes\), "
        r"scope.session_id \(1,024 bytes\), namespace \(7 bytes\) make an entry .* in the index "
        r"pk_pgmemory_facts",
    )
    assert await store.merge_facts(
        "profile", MemoryScope(user_id=emoji, session_id=emoji), {"a": 1}
    ) == {"a": 1}


# --- malformed structure ---------------------------------------------------------------------


async def test_keys_that_collapse_in_json_are_refused(store: MemoryStore, collection: str) -> None:
    scope = MemoryScope(user_id=unique("u"))
    clash = {1: SECRET, "1": SECRET}
    await _refused(
        lambda: store.add(collection, [MemoryRecord(content="x", scope=scope, metadata=clash)]),
        match=r"records\[0\]\.metadata: key #1 .* same JSON key",
    )
    await _refused(lambda: store.merge_facts("p", scope, clash), match="same JSON key")
    await _refused(
        lambda: store.append_history(
            "s", [{"message_id": "m", "role": "user", "x": {"a\x00": 1, "a\ufffd": 2}}]
        ),
        match=r"messages\[0\]: key #1 of an object at depth 2",
    )


async def test_deep_nesting_gets_a_depth_limit_not_recursion_error(
    store: MemoryStore, collection: str
) -> None:
    deep: dict[str, Any] = {}
    inner = deep
    for _ in range(5_000):
        inner["k"] = {}
        inner = inner["k"]
    scope = MemoryScope(user_id=unique("u"))
    match = f"nested more than {MAX_JSON_DEPTH} levels deep"
    await _refused(
        lambda: store.add(collection, [MemoryRecord(content="x", scope=scope, metadata=deep)]),
        match=match,
    )
    await _refused(lambda: store.merge_facts("p", scope, deep), match=match)
    await _refused(
        lambda: store.append_history("s", [{"message_id": "m", "role": "user", "d": deep}]),
        match=match,
    )
    # 64 levels are fine.
    ok: dict[str, Any] = {}
    inner = ok
    for _ in range(MAX_JSON_DEPTH - 1):
        inner["k"] = {}
        inner = inner["k"]
    await store.add(collection, [MemoryRecord(content="x", scope=scope, metadata=ok)])


async def test_none_where_a_scope_is_required() -> None:
    with pytest.raises(ScopeError, match="a scope must be a mapping .* got None"):
        MemoryScope.from_dict(None)  # type: ignore[arg-type]
    with pytest.raises(ScopeError, match="1 unknown scope keys"):
        MemoryScope.from_dict({SECRET: "x"})


async def test_a_list_where_a_string_id_is_expected(store: MemoryStore, collection: str) -> None:
    listed = [SECRET]
    with pytest.raises(ScopeError, match="session_id must be a string or None, got a list"):
        MemoryScope(session_id=listed)  # type: ignore[arg-type]
    with pytest.raises(ScopeError, match="got a list"):
        MemoryScope.from_dict({"user_id": listed})
    scope = MemoryScope(user_id=unique("u"))
    await _refused(
        lambda: store.add(collection, [MemoryRecord(content="x", scope=scope, message_id=listed)]),  # type: ignore[arg-type]
        match=r"records\[0\]\.message_id must be a non-blank string, got a list",
    )
    await _refused(
        lambda: store.append_history(listed, []),
        match="session_id must be a non-blank string, got a list",
    )  # type: ignore[arg-type]
    await _refused(
        lambda: store.append_history("s", [], user_id=listed), match="user_id must be a string"
    )  # type: ignore[arg-type]
    await _refused(
        lambda: store.read_history("s", user_id=listed), match="user_id must be a string"
    )  # type: ignore[arg-type]
    await _refused(
        lambda: store.merge_facts(listed, scope, {}), match="namespace must be a non-blank string"
    )  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="RecallTrace.session_id must be a string"):
        RecallTrace(session_id=listed)  # type: ignore[arg-type]
    assert await _memory_rows(store, collection) == 0


# --- messages carry no user data -------------------------------------------------------------


async def test_validation_messages_never_repeat_text_or_ids(
    store: MemoryStore, collection: str
) -> None:
    scope = MemoryScope(user_id=unique("u"))
    cases: list[tuple[Callable[[], Awaitable[Any]], str]] = [
        (
            lambda: store.add(collection, [MemoryRecord(content=SECRET * 5_000, scope=scope)]),
            "characters long",
        ),
        (
            lambda: store.add(collection, [MemoryRecord(content=" ", scope=scope, role=SECRET)]),
            "blank",
        ),
        (
            lambda: store.add(collection, [MemoryRecord(content="x", scope=scope, role=SECRET)]),
            "role is not one of",
        ),
        (
            lambda: store.add(
                collection, [MemoryRecord(content="x", scope=scope, source_type=SECRET)]
            ),
            "source_type",
        ),
        (
            lambda: store.add(
                collection, [MemoryRecord(content="x", scope=scope, embedding=SECRET)]
            ),
            "embedding",
        ),  # type: ignore[arg-type]
        (
            lambda: store.add(
                collection, [MemoryRecord(content="x", scope=scope, source_id=SECRET * 30)]
            ),
            "source_id is",
        ),
        (
            lambda: store.add(collection, [MemoryRecord(content="x", scope=SECRET)]),
            "must be a MemoryScope, got a str",
        ),  # type: ignore[arg-type]
        (lambda: store.search(collection, SECRET), "must be a MemoryScope"),  # type: ignore[arg-type]
        (lambda: store.search(collection, scope, query=SECRET, limit=SECRET), "limit is a str"),  # type: ignore[arg-type]
        (lambda: store.search(collection, scope, query=SECRET, mode=SECRET), "mode is not one of"),
        (lambda: store.list(collection, scope, offset=SECRET), "offset is a str"),  # type: ignore[arg-type]
        (lambda: store.delete(collection, ids=[SECRET], scope=scope), r"ids\[0\] is not a UUID"),
        (lambda: store.merge_facts("p", MemoryScope(), {"a": 1}), "non-empty"),
        (lambda: store.merge_facts("p", SECRET, {"a": 1}), "got a str"),  # type: ignore[arg-type]
        (lambda: store.merge_facts("p", scope, {"a": object()}), "not JSON-serialisable"),
        (lambda: store.append_history("s", [SECRET]), r"messages\[0\] must be a dict"),  # type: ignore[list-item]
        (
            lambda: store.append_history("s", [{"message_id": "m", "role": SECRET}]),
            "role is not one of",
        ),
        (lambda: store.erase_user(SECRET * 30), "user_id is"),
    ]
    for call, match in cases:
        await _refused(call, match=match)
    with pytest.raises(ScopeError) as info:
        MemoryScope(user_id=SECRET * 30)
    assert SECRET not in str(info.value)
