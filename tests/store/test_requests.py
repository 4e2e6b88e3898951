"""The operations as typed values (:mod:`pgmemory.store.requests`): a recall is one
``RecallRequest``, given whole or as keywords, checked once, and built by the provider from
its options."""

from __future__ import annotations

import dataclasses
import uuid

import pytest

from pgmemory import (
    ChatHistoryMemoryProviderOptions,
    MemoryRecord,
    MemoryScope,
    MemoryStore,
    RecallRequest,
    RecallTrace,
    SearchWeights,
)
from pgmemory.errors import InvalidInputError
from pgmemory.store import requests
from pgmemory.store.store import MemoryStore as StoreClass


def test_every_recall_option_is_a_field_of_the_request_and_nothing_else() -> None:
    """The store's recall declares no option of its own: its signature is the collection, the
    scope, the request and the request's fields as keywords."""
    import inspect

    parameters = list(inspect.signature(StoreClass.recall).parameters)
    assert parameters == ["self", "collection", "scope", "request", "options"]
    names = [f.name for f in dataclasses.fields(RecallRequest)]
    assert "exclude_message_ids" in names and "max_tokens" in names


def test_keywords_are_set_on_the_request_and_checked() -> None:
    base = RecallRequest(query="tea", max_results=5)
    built = requests.build(RecallRequest, base, {"recent_turns": 0, "heading": ""})
    assert (built.query, built.max_results, built.recent_turns) == ("tea", 5, 0)
    assert built.heading is None  # a blank heading is none
    assert built.weights == SearchWeights() and built.trace == RecallTrace()
    assert base.recent_turns == 2  # the given request is not changed
    ids = requests.build(RecallRequest, None, {"exclude_message_ids": ["a", "", "a", "b"]})
    assert ids.exclude_message_ids == ("a", "b")  # distinct, and what no row can have dropped


def test_an_unknown_option_is_named_with_the_ones_there_are() -> None:
    with pytest.raises(TypeError, match="no option max_result; its options: query, max_results"):
        requests.build(RecallRequest, None, {"max_result": 3})


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("max_results", 101, "max_results is 101; expected an integer from 0 to 100"),
        ("audit", "no", "audit is"),
        ("allow_unscoped", 1, "allow_unscoped is"),
        ("weights", {"vector": 1}, "weights is"),
        ("trace", "me", "trace is"),
        ("exclude_message_ids", "m1", "expected a sequence of message ids"),
    ],
)
def test_a_bad_value_is_refused_with_what_to_pass(field: str, value: object, named: str) -> None:
    with pytest.raises(InvalidInputError, match=named):
        requests.build(RecallRequest, None, {field: value})


def test_a_request_of_another_kind_is_refused() -> None:
    with pytest.raises(InvalidInputError, match="expected a RecallRequest"):
        requests.build(RecallRequest, {"query": "x"}, {})  # type: ignore[arg-type]


def test_the_provider_options_build_the_request() -> None:
    options = ChatHistoryMemoryProviderOptions(
        max_results=7,
        recent_turns=4,
        recall_mode="text",
        near_duplicate_threshold=0.5,
        include_tools_in_recall=True,
        max_context_tokens=None,
        allow_unscoped_search=True,
    )
    trace = RecallTrace(provider="p", session_id="s")
    built = options.recall_request(query="q", heading="H", trace=trace, exclude_message_ids=["m1"])
    assert built == RecallRequest(
        query="q",
        max_results=7,
        recent_turns=4,
        max_tokens=None,
        mode="text",
        weights=options.weights,
        near_duplicate_threshold=0.5,
        include_tools=True,
        heading="H",
        trace=trace,
        allow_unscoped=True,
        exclude_message_ids=["m1"],
    )


async def test_a_request_and_its_keywords_recall_the_same(
    store: MemoryStore, collection: str
) -> None:
    scope = MemoryScope(user_id=f"u{uuid.uuid4().hex[:8]}", session_id="s")
    await store.add(
        collection,
        [
            MemoryRecord(content=text, scope=scope, role=role)
            for text, role in (
                ("I am allergic to peanuts", "user"),
                ("Noted, no peanuts.", "assistant"),
                ("Book me a window seat", "user"),
            )
        ],
    )
    request = RecallRequest(query="peanut allergy", max_results=1, recent_turns=0, audit=False)
    whole = await store.recall(collection, scope, request)
    keywords = await store.recall(
        collection, scope, query="peanut allergy", max_results=1, recent_turns=0, audit=False
    )
    mixed = await store.recall(collection, scope, request, max_results=2)
    assert whole.text == keywords.text and len(whole.items) == 1
    assert len(mixed.items) == 2
