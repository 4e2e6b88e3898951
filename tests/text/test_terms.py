"""Keyword terms: English stems, CJK bigrams, stop words (pgmemory.text.terms and .stem)."""

from __future__ import annotations

import pytest

from pgmemory.text import terms as t
from pgmemory.text.stem import stem

#: Porter2 stems as Snowball's own English stemmer (snowballstemmer 3.1.1) gives them:
#: plain inflections, the exceptional forms, the R1 prefixes, and every suffix step.
SNOWBALL = [
    ("ordered", "order"),
    ("orders", "order"),
    ("ordering", "order"),
    ("order", "order"),
    ("pizzas", "pizza"),
    ("pizza", "pizza"),
    ("allergic", "allerg"),
    ("allergy", "allergi"),
    ("allergies", "allergi"),
    ("peanuts", "peanut"),
    ("running", "run"),
    ("runs", "run"),
    ("ran", "ran"),
    ("generously", "generous"),
    ("generous", "generous"),
    ("generate", "generat"),
    ("generation", "generat"),
    ("communication", "communic"),
    ("university", "universiti"),
    ("universities", "universiti"),
    ("organization", "organiz"),
    ("organic", "organic"),
    ("evening", "evening"),
    ("evenings", "evening"),
    ("adding", "add"),
    ("added", "add"),
    ("add", "add"),
    ("inning", "inning"),
    ("outing", "outing"),
    ("canning", "canning"),
    ("herring", "herring"),
    ("earring", "earring"),
    ("proceed", "proceed"),
    ("proceeded", "proceed"),
    ("exceed", "exceed"),
    ("succeeding", "succeed"),
    ("dying", "die"),
    ("lying", "lie"),
    ("tying", "tie"),
    ("vying", "vie"),
    ("skies", "sky"),
    ("skis", "ski"),
    ("sky", "sky"),
    ("news", "news"),
    ("cries", "cri"),
    ("ties", "tie"),
    ("gently", "gentl"),
    ("early", "earli"),
    ("only", "onli"),
    ("singly", "singl"),
    ("ugly", "ugli"),
    ("idly", "idl"),
    ("hopping", "hop"),
    ("hoped", "hope"),
    ("hoping", "hope"),
    ("cats", "cat"),
    ("caresses", "caress"),
    ("ponies", "poni"),
    ("feed", "feed"),
    ("agreed", "agre"),
    ("disabled", "disabl"),
    ("matting", "mat"),
    ("filing", "file"),
    ("failing", "fail"),
    ("happiness", "happi"),
    ("happily", "happili"),
    ("relational", "relat"),
    ("conditional", "condit"),
    ("rational", "ration"),
    ("valenci", "valenc"),
    ("digitizer", "digit"),
    ("conformabli", "conform"),
    ("radicalli", "radic"),
    ("differentli", "differ"),
    ("vileli", "vile"),
    ("analogousli", "analog"),
    ("vietnamization", "vietnam"),
    ("predication", "predic"),
    ("operator", "oper"),
    ("feudalism", "feudal"),
    ("decisiveness", "decis"),
    ("hopefulness", "hope"),
    ("callousness", "callous"),
    ("formaliti", "formal"),
    ("sensitiviti", "sensit"),
    ("sensibiliti", "sensibl"),
    ("triplicate", "triplic"),
    ("formative", "format"),
    ("formalize", "formal"),
    ("electriciti", "electr"),
    ("electrical", "electr"),
    ("hopeful", "hope"),
    ("goodness", "good"),
    ("revival", "reviv"),
    ("allowance", "allow"),
    ("inference", "infer"),
    ("airliner", "airlin"),
    ("gyroscopic", "gyroscop"),
    ("adjustable", "adjust"),
    ("defensible", "defens"),
    ("irritant", "irrit"),
    ("replacement", "replac"),
    ("adjustment", "adjust"),
    ("dependent", "depend"),
    ("adoption", "adopt"),
    ("communism", "communism"),
    ("activate", "activ"),
    ("angulariti", "angular"),
    ("homologous", "homolog"),
    ("effective", "effect"),
    ("bowdlerize", "bowdler"),
    ("probate", "probat"),
    ("rate", "rate"),
    ("cease", "ceas"),
    ("controll", "control"),
    ("roll", "roll"),
    ("past", "past"),
    ("pasting", "paste"),
    ("psychologist", "psycholog"),
    ("dermatologist", "dermatolog"),
]


@pytest.mark.parametrize(("word", "expected"), SNOWBALL)
def test_stem_matches_snowball_english(word: str, expected: str) -> None:
    assert stem(word) == expected


def test_stem_leaves_non_ascii_words_and_numbers_alone() -> None:
    for word in ("café", "naïve", "2023", "covid19", "москва", "x"):
        assert stem(word) == word


def test_inflections_share_a_term() -> None:
    assert set(t.terms("order")) <= set(t.terms("I ordered two pizzas"))
    assert set(t.terms("orders pizza")) <= set(t.terms("I ordered two pizzas"))
    assert "peanut" in set(t.terms("peanut allergy")) & set(t.terms("allergic to peanuts"))
    assert t.terms("Running runs") == ["run", "run"]


def test_stop_words_are_dropped_before_stemming() -> None:
    assert t.terms("What is the order of the day") == ["order", "day"]
    # "was" is a stop word; "as" and "wa" would be the stems of nothing here
    assert t.terms("it was") == []


def test_cjk_bigrams_are_kept_and_not_stemmed() -> None:
    assert t.terms("我喜欢北京") == ["我喜", "喜欢", "欢北", "北京"]
    assert t.terms("猫") == ["猫"]
    assert t.terms("ordered 寿司 twice") == ["order", "寿司", "twice"]


def test_stemming_switch_gives_the_surface_words() -> None:
    try:
        t.STEMMING = False
        assert t.terms("I ordered pizzas") == ["ordered", "pizzas"]
    finally:
        t.STEMMING = True
    assert t.terms("I ordered pizzas") == ["order", "pizza"]


def test_query_is_an_or_of_distinct_stems() -> None:
    assert t.query("orders ordered pizza") == "order or pizza"
    assert t.query("or ors") == ""  # the stem of "ors" is the operator word "or": dropped
    assert t.document("Ordered pizzas") == "order pizza"


def test_a_searchs_terms_come_from_one_pass() -> None:
    """A search binds the distinct terms (first seen first) and the OR query made of them."""
    assert t.distinct("pizzas ordered pizza orders") == ["pizza", "order"]
    assert t.distinct("or ors tea") == ["or", "tea"]  # the term "or" is matched as a term ...
    assert t.or_query(t.distinct("or ors tea")) == t.query("or ors tea") == "tea"  # not an operator


async def test_keyword_search_finds_inflected_forms(store, collection: str) -> None:
    from pgmemory.store.records import MemoryRecord, MemoryScope
    from tests.conftest import unique

    scope = MemoryScope(user_id=unique("u"))
    await store.add(
        collection,
        [
            MemoryRecord(content="I ordered two pizzas last night", scope=scope),
            MemoryRecord(content="I am allergic to peanuts", scope=scope),
            MemoryRecord(content="The weather was sunny", scope=scope),
        ],
    )
    for query, expected in (
        ("order", "I ordered two pizzas last night"),
        ("orders pizza", "I ordered two pizzas last night"),
        ("peanut allergy", "I am allergic to peanuts"),
    ):
        hits = await store.search(collection, scope, query=query, mode="text", limit=3)
        assert [h.memory.content for h in hits] == [expected], query


async def test_migration_restems_rows_written_before(
    fresh_database: str, embedder, settings
) -> None:
    import sqlalchemy as sa

    from pgmemory.store import migrate
    from pgmemory.store.records import MemoryRecord, MemoryScope
    from pgmemory.store.store import MemoryStore

    migrate.upgrade(fresh_database)
    scope = MemoryScope(user_id="u")
    async with MemoryStore(fresh_database, settings=settings, embedder=embedder) as store:
        await store.create_collection("c")
        await store.add("c", [MemoryRecord(content="I ordered two pizzas", scope=scope)])
    # A row as an earlier version wrote it: unstemmed terms.
    engine = sa.create_engine(fresh_database)
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE pgmemory_memories SET search_vector = to_tsvector('simple', 'ordered two pizzas')"
            )
        )
    engine.dispose()
    async with MemoryStore(fresh_database, settings=settings, embedder=embedder) as store:
        assert await store.search("c", scope, query="order", mode="text") == []  # the control
    migrate.downgrade(fresh_database, "0004")
    migrate.upgrade(fresh_database)
    async with MemoryStore(fresh_database, settings=settings, embedder=embedder) as store:
        hits = await store.search("c", scope, query="order", mode="text")
        assert [h.memory.content for h in hits] == ["I ordered two pizzas"]
