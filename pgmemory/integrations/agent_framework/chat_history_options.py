"""The options of the chat-history memory provider, with their defaults and checks."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from pgmemory.errors import InvalidInputError
from pgmemory.integrations.agent_framework.messages import (
    MessageFilter,
    all_messages,
    external_only,
)
from pgmemory.integrations.agent_framework.rendering import DEFAULT_CONTEXT_PROMPT
from pgmemory.store.modes import DEFAULT_MODE, SearchMode
from pgmemory.store.records import RecallTrace, SearchWeights
from pgmemory.store.requests import RecallRequest

#: When the provider recalls: before every model call, or when the model calls its tool.
SearchTime = Literal["before_ai_invoke", "on_demand_function_calling"]
#: Default description of the on-demand search tool.
DEFAULT_TOOL_DESCRIPTION = (
    "Allows searching for related previous chat history to help answer the user question."
)


#: Default budget of a recall, in estimated tokens: a small share of any model's context.
DEFAULT_MAX_CONTEXT_TOKENS = 2000


def redact_all(_value: str) -> str:
    """The default log redactor: hides the value entirely."""
    return "<redacted>"


@dataclass(frozen=True, kw_only=True)
class ChatHistoryMemoryProviderOptions:
    """Every option of :class:`~pgmemory.ChatHistoryMemoryProvider`, with its default.

    The first group decides when recall happens, what is searched with and what is stored;
    the second shapes recall beyond similarity alone, which cannot find "the last order" from
    "order me a meal".
    """

    #: When to recall: inject before every model call, or expose a search tool to the model.
    search_time: SearchTime = "before_ai_invoke"
    #: Name and description of the on-demand tool (one required string parameter userQuestion).
    function_tool_name: str = "Search"
    function_tool_description: str = DEFAULT_TOOL_DESCRIPTION
    #: Heading of the injected memories message.
    context_prompt: str = DEFAULT_CONTEXT_PROMPT
    #: Most memories recalled by similarity (and keywords) per search.
    max_results: int = 3
    #: Which current messages make the search query (default: the caller's own, the messages
    #: without the framework's ``_attribution`` stamp).
    search_input_message_filter: MessageFilter = external_only
    #: Which request messages are stored (default: the caller's own, never recalled memories).
    storage_input_message_filter: MessageFilter = external_only
    #: Which response messages are stored (default: all).
    storage_output_message_filter: MessageFilter = all_messages
    #: Store the run's tool calls and tool results too (tagged, so recall can tell them apart).
    store_tool_messages: bool = True
    #: Recall stored tool calls and tool results like conversation. Off by default: they are
    #: noise in a recall ("[called GetMenu with {}]") and the outcome is in the answer anyway.
    #: The seeds store a message's text only, so they neither store nor recall tool traffic.
    include_tools_in_recall: bool = False
    #: Hides sensitive values (user ids, texts, queries) in logs unless sensitive data is allowed.
    redactor: Callable[[str], str] = redact_all
    #: Let user ids, message text and queries appear in logs (and query text in the audit).
    enable_sensitive_telemetry_data: bool = False
    #: Allow a search scope with no dimension set (it would search everybody's memories).
    allow_unscoped_search: bool = False

    #: Always show the most recent turns of the search scope (a turn: a user message and
    #: everything stored after it), with their time; 0 turns it off. Two turns show "the last
    #: order" even when a short exchange ("thanks!") followed it.
    recent_turns: int = 2
    #: How memories are ranked: "hybrid" fuses similarity, keywords and recency; "vector" is
    #: similarity alone; "text" is keywords alone.
    recall_mode: SearchMode = DEFAULT_MODE
    #: Weights of the hybrid ranking: score fusion of similarity and keywords, with a little
    #: recency, so of two equally good matches the newer wins ("I moved to Berlin" over "I
    #: live in Lisbon"); the most recent turns are shown anyway (``recent_turns``).
    weights: SearchWeights = field(default_factory=lambda: SearchWeights(recency=0.1))
    #: Drop recalled memories whose keyword terms overlap an already kept one this much (0–1).
    near_duplicate_threshold: float = 0.9
    #: One budget, in estimated tokens (:func:`pgmemory.text.tokens.estimate_tokens`: a CJK
    #: character is one token, other text about four characters or one word a token), for
    #: everything a recall shows: heading and note, similar memories and recent turns together
    #: (and the on-demand tool's answer). Long memories and tool results are shortened (head
    #: and tail around a ``[… N characters omitted …]`` marker); similar memories are kept in
    #: rank order and recent messages newest first while they fit. ``None``: unbounded, every
    #: memory in full (up to ``max_results`` plus ``recent_turns`` turns of rows of up to the
    #: store's ``max_text_chars`` characters each).
    max_context_tokens: int | None = DEFAULT_MAX_CONTEXT_TOKENS

    def __post_init__(self) -> None:
        if self.search_time not in ("before_ai_invoke", "on_demand_function_calling"):
            raise InvalidInputError(
                f"search_time is {self.search_time!r}; expected 'before_ai_invoke' or "
                "'on_demand_function_calling'"
            )
        if not isinstance(self.max_results, int) or not 1 <= self.max_results <= 100:
            raise InvalidInputError(f"max_results is {self.max_results!r}; expected 1 to 100")
        if not isinstance(self.recent_turns, int) or not 0 <= self.recent_turns <= 20:
            raise InvalidInputError(f"recent_turns is {self.recent_turns!r}; expected 0 to 20")
        threshold = self.near_duplicate_threshold
        if not isinstance(threshold, (int, float)) or not 0.0 < threshold <= 1.0:
            raise InvalidInputError(
                f"near_duplicate_threshold is {self.near_duplicate_threshold!r}; expected (0, 1]"
            )
        budget = self.max_context_tokens
        if budget is not None and (
            isinstance(budget, bool) or not isinstance(budget, int) or budget < 100
        ):
            raise InvalidInputError(
                f"max_context_tokens is {budget!r}; expected an int of at least 100, or None "
                "(unbounded)"
            )
        if not callable(self.redactor):
            raise InvalidInputError(f"redactor is {self.redactor!r}; pass a callable(str) -> str")

    def recall_request(
        self,
        *,
        query: str | None,
        heading: str | None,
        trace: RecallTrace,
        exclude_message_ids: Sequence[str],
    ) -> RecallRequest:
        """The store's recall (:class:`~pgmemory.store.requests.RecallRequest`) these options
        choose, for ``query`` under ``heading``: the newest turns, the matches with their
        neighbours, near-duplicates dropped, fitted to ``max_context_tokens``; tool calls and
        results left out unless ``include_tools_in_recall``, and so are the messages the model
        is sent anyway (``exclude_message_ids``)."""
        return RecallRequest(
            query=query,
            max_results=self.max_results,
            recent_turns=self.recent_turns,
            max_tokens=self.max_context_tokens,
            mode=self.recall_mode,
            weights=self.weights,
            near_duplicate_threshold=self.near_duplicate_threshold,
            include_tools=self.include_tools_in_recall,
            heading=heading,
            trace=trace,
            allow_unscoped=self.allow_unscoped_search,
            exclude_message_ids=exclude_message_ids,
        )


__all__ = [
    "DEFAULT_MAX_CONTEXT_TOKENS",
    "DEFAULT_TOOL_DESCRIPTION",
    "ChatHistoryMemoryProviderOptions",
    "SearchTime",
    "redact_all",
]
