"""Every exception pgmemory raises on purpose.

All derive from :class:`PgMemoryError`, so callers can catch the library's errors in one
place. Input errors also derive from :class:`ValueError`, which is what they are.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pgmemory.runtime.agent import AgentResponse


class PgMemoryError(Exception):
    """Base class of pgmemory's own errors."""


class InvalidInputError(PgMemoryError, ValueError):
    """A value passed in is unusable; the message names the value and the fix."""


class ScopeError(InvalidInputError):
    """A memory scope is missing, empty where it must not be, or malformed."""


class CollectionError(InvalidInputError):
    """A collection is unknown, or a vector does not fit it (dimensions, model)."""


class DatabaseNotReadyError(PgMemoryError):
    """The database lacks the pgvector extension or pgmemory's schema."""


class EmbeddingError(PgMemoryError):
    """An embedder failed or returned vectors that cannot be stored."""


class ToolArgumentsError(InvalidInputError):
    """The model's arguments do not fit the tool's parameters."""


class ToolLoopLimitError(PgMemoryError):
    """The model kept asking for tools after ``max_tool_iterations`` rounds."""


class StructuredOutputError(PgMemoryError):
    """The model's reply does not match the requested ``response_format``."""


class AfterRunError(PgMemoryError):
    """One or more providers' ``after_run`` failed after the model had answered.

    Every provider's ``after_run`` still ran, inside the providers' units of work, which were
    then rolled back: what the database-backed providers would have stored of the turn is not
    kept, so a retried run stores it once. ``errors`` holds each failure as (provider source
    id, exception), in provider order, and ``response`` the model's answer, so the caller can
    still use it. The message names only providers, exception types and counts: the
    exceptions' own messages may carry user text, so they are left to ``errors``.
    """

    def __init__(self, response: AgentResponse, errors: list[tuple[str, Exception]]) -> None:
        self.response = response
        self.errors = errors
        details = "; ".join(f"{source}: {type(exc).__name__}" for source, exc in errors)
        super().__init__(
            f"{len(errors)} context provider failure(s) after the model answered ({details}); "
            "every provider's after_run ran and their units of work were rolled back; the "
            "answer is in this error's .response and the exceptions in .errors"
        )


class MissingExtraError(PgMemoryError, ImportError):
    """An optional dependency is not installed; the message names the extra to install."""
