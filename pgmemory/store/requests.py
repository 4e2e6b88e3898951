"""The store's operations as typed values: each one's options, defaults and checks, declared once.

A request is a frozen dataclass of everything an operation takes beyond its collection and
scope. :meth:`MemoryStore.recall <pgmemory.store.store.MemoryStore.recall>` takes a
:class:`RecallRequest`, or its fields as keywords (:func:`build`: the request with those fields
set); a provider builds one from its own options. Each request's :meth:`~RecallRequest.checked`
refuses a bad value with what to pass instead and returns the request as the operation runs it
(defaults filled in, values normalised), before any SQL. A new option of an operation is one
field here (with its check), and the module that runs the operation reads it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Self, TypeVar

from pgmemory.errors import InvalidInputError
from pgmemory.store.modes import DEFAULT_MODE, SEARCH_MODES, SearchMode
from pgmemory.store.records import RecallTrace, SearchWeights
from pgmemory.store.validation import check_choice, check_name, check_number, describe

#: Most matches a recall shows, and most recent turns.
MAX_RECALL_RESULTS = 100
MAX_RECENT_TURNS = 100


@dataclass(frozen=True, kw_only=True)
class RecallRequest:
    """What a recall shows (:meth:`MemoryStore.recall <pgmemory.store.store.MemoryStore.recall>`),
    with its defaults: the newest turns of the scope and the best matches for ``query``,
    fitted into a token budget, in one audited statement (:mod:`pgmemory.store.recall`)."""

    #: What to find matches for; None or blank: the recent turns only.
    query: str | None = None
    #: Most matches shown (0 to 100).
    max_results: int = 3
    #: The newest user turns shown, with everything stored after each (0 to 100).
    recent_turns: int = 2
    #: The budget of everything shown, in estimated tokens; None: every row whole.
    max_tokens: int | None = 2000
    #: How matches are ranked (:data:`pgmemory.store.modes.SEARCH_MODES`).
    mode: SearchMode = DEFAULT_MODE
    #: The hybrid ranking's weights (None: :class:`~pgmemory.store.records.SearchWeights`'s).
    weights: SearchWeights | None = None
    #: A match whose term set overlaps a shown row's this much (Jaccard) or more is dropped.
    near_duplicate_threshold: float = 0.9
    #: Show stored tool calls and results too.
    include_tools: bool = False
    #: The heading of the recall's text (None or blank: none).
    heading: str | None = None
    #: Who recalls, for the audit row (None: nobody named).
    trace: RecallTrace | None = None
    #: Allow a scope with no dimension set (it would read everybody's memories).
    allow_unscoped: bool = False
    #: Write the recall audit row (in the same statement).
    audit: bool = True
    #: Message ids the caller shows the model anyway: never shown again.
    exclude_message_ids: Sequence[str] = field(default=())

    def checked(self) -> Self:
        """This request as the recall runs it: each value checked (an :class:`InvalidInputError
        <pgmemory.errors.InvalidInputError>` names the bad one and what to pass), the
        defaults of ``weights`` and ``trace`` filled in, a blank heading None, and
        ``exclude_message_ids`` the distinct ids a stored row may have."""
        if self.query is not None and not isinstance(self.query, str):
            raise InvalidInputError(f"query must be a string or None, got {describe(self.query)}")
        check_choice(self.mode, what="mode", choices=SEARCH_MODES)
        _count(self.max_results, "max_results", MAX_RECALL_RESULTS)
        _count(self.recent_turns, "recent_turns", MAX_RECENT_TURNS)
        budget = self.max_tokens
        if budget is not None and (
            not isinstance(budget, int) or isinstance(budget, bool) or budget < 1
        ):
            raise InvalidInputError(
                f"max_tokens is {describe(budget)}; expected a positive integer or None"
            )
        threshold = check_number(self.near_duplicate_threshold, what="near_duplicate_threshold")
        for name in ("include_tools", "allow_unscoped", "audit"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidInputError(
                    f"{name} is {describe(getattr(self, name))}; expected a bool"
                )
        if self.heading is not None and not isinstance(self.heading, str):
            raise InvalidInputError(
                f"heading is {describe(self.heading)}; expected a string or None"
            )
        if self.weights is not None and not isinstance(self.weights, SearchWeights):
            raise InvalidInputError(
                f"weights is {describe(self.weights)}; expected a SearchWeights or None"
            )
        if self.trace is not None and not isinstance(self.trace, RecallTrace):
            raise InvalidInputError(
                f"trace is {describe(self.trace)}; expected a RecallTrace or None"
            )
        return dataclasses.replace(
            self,
            near_duplicate_threshold=threshold,
            heading=self.heading or None,
            weights=self.weights or SearchWeights(),
            trace=self.trace or RecallTrace(),
            exclude_message_ids=_message_ids(self.exclude_message_ids),
        )


R = TypeVar("R", bound=RecallRequest)


def build(kind: type[R], request: R | None, options: Mapping[str, Any]) -> R:
    """``request`` (None: ``kind``'s defaults) with the fields in ``options`` set, checked: the
    keyword form of an operation. A name that is no field of ``kind`` is a :class:`TypeError`
    naming it, as for any keyword argument a function does not take."""
    if request is not None and not isinstance(request, kind):
        raise InvalidInputError(f"request is {describe(request)}; expected a {kind.__name__}")
    names = [f.name for f in dataclasses.fields(kind)]
    unknown = sorted(set(options) - set(names))
    if unknown:
        raise TypeError(
            f"{kind.__name__} has no option {', '.join(unknown)}; its options: {', '.join(names)}"
        )
    return dataclasses.replace(request if request is not None else kind(), **options).checked()


def _count(value: object, what: str, maximum: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= maximum:
        raise InvalidInputError(
            f"{what} is {describe(value)}; expected an integer from 0 to {maximum}"
        )
    return value


def _message_ids(values: object) -> tuple[str, ...]:
    """``exclude_message_ids`` as the statement takes it: the distinct ids a stored row may
    have, in given order. An id no row can have (blank, too long, with NUL or a lone
    surrogate: what storage refuses) is dropped, not refused: it excludes nothing."""
    if isinstance(values, str | bytes) or not isinstance(values, Sequence | set | frozenset):
        raise InvalidInputError(
            f"exclude_message_ids is {describe(values)}; expected a sequence of message ids"
        )
    kept: dict[str, None] = {}
    for value in values:
        if not isinstance(value, str):
            raise InvalidInputError(
                f"exclude_message_ids holds {describe(value)}; expected strings (message ids)"
            )
        try:
            kept[check_name(value, what="a message id")] = None
        except InvalidInputError:
            continue
    return tuple(kept)
