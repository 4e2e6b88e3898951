"""Fact memory: structured facts about the user, extracted by the chat model, kept in PostgreSQL.

:class:`FactMemoryProvider` is a context provider built around a pydantic model of facts (for
example the user's name and age)::

    class UserInfo(BaseModel):
        name: str | None
        age: int | None

    facts = FactMemoryProvider(store, client, UserInfo, user_id=current_user)
    agent = Agent(client=client, instructions="You are friendly.", context_providers=[facts])

Before each run it injects the scope's stored facts (a JSON object, labelled as data) and asks
the agent to request every required fact still unknown. After a successful run whose user
messages may state a fact (``extract_when``: by default a cheap local check,
:mod:`~pgmemory.integrations.agent_framework.fact_trigger`) it sends them to the chat model with
a JSON-schema response format derived from the model (every field nullable), validates the
reply through the model, and merges it with :meth:`pgmemory.MemoryStore.merge_facts`: new facts
fill gaps, corrections overwrite, and every change is audited in ``pgmemory_fact_audit`` (old
and new value, actor = ``source_id``, and the ids of the messages it came from). The
extraction runs as the after-run phase begins, before any transaction is open; the merge joins
the turn's one transaction.

With ``extraction="queued"`` the turn makes no model call: it queues its user messages as a
job in its own transaction (:mod:`pgmemory.store.jobs`), and a worker extracts them later
(:class:`~pgmemory.integrations.agent_framework.fact_worker.FactWorker`: ``pgmemory worker``,
an in-process task, or :meth:`FactMemoryProvider.process_now`), shown the facts known so far,
so a contradicted fact is replaced (the audit keeps the old value). With ``profile=True`` the
same call keeps a short summary of the user, injected as background data like the facts.

The scope is derived from the bound user id (``user_id=``) on every run; a session whose
recorded scope differs is refused (:mod:`~pgmemory.integrations.agent_framework.binding`).

Security: fact values come from user messages, so they are untrusted. They are injected only
as JSON-encoded values under a header that tells the model they are data, never instructions,
so a value cannot break out of its string. Logs carry counts and field names, never values.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agent_framework import AgentSession, ContextProvider, Message, SessionContext
from pydantic import BaseModel

import pgmemory.telemetry as telemetry
from pgmemory.errors import InvalidInputError, ScopeError
from pgmemory.integrations.agent_framework.binding import (
    UserId,
    bind_state,
    check_callable,
    check_user_id,
    provider_state,
    resolve_user_id,
)
from pgmemory.integrations.agent_framework.fact_prompts import (
    DEFAULT_EXTRACTION_PROMPT,
    DEFAULT_FACTS_PROMPT,
    DEFAULT_MISSING_PROMPT,
    DEFAULT_PROFILE_PROMPT,
    EXTRACTION,
    KNOWN_FACTS_PROMPT,
    PROFILE_INSTRUCTION,
    PROFILE_KEY,
    Extraction,
)
from pgmemory.integrations.agent_framework.fact_schema import (
    PROFILE_FIELD,
    extraction_model,
    response_format,
    validate_values,
    with_profile,
)
from pgmemory.integrations.agent_framework.fact_trigger import (
    EXTRACT_WHEN,
    ExtractWhen,
    field_words,
    may_state_fact,
)
from pgmemory.integrations.agent_framework.messages import (
    MessageFilter,
    ensure_identity,
    external_only,
    user_messages,
)
from pgmemory.integrations.agent_framework.turn import TurnWriter, after_run_together, check_run
from pgmemory.store.jobs import MAX_DELAY_S, JobQueue
from pgmemory.store.recall_text import json_text
from pgmemory.store.records import MemoryScope
from pgmemory.store.validation import check_number
from pgmemory.vocabulary import FACTS_NAMESPACE

if TYPE_CHECKING:
    from pgmemory.store.store import MemoryStore

logger = logging.getLogger(__name__)


class FactMemoryProvider(ContextProvider, TurnWriter):
    """Remembers structured facts about the user (a pydantic model) per scope, in PostgreSQL.

    An extraction that fails (endpoint error, reply not matching the schema, value rejected by
    the model's validation) is logged without content and does not fail the run; a database
    error while merging does propagate. A run that failed stores nothing.

    Args:
        store: the :class:`~pgmemory.MemoryStore` holding the facts.
        chat_client: the agent-framework chat client used for extraction (usually the agent's
            own, e.g. ``OpenAIChatCompletionClient``); called with
            ``get_response(messages, options={"response_format": ..., **extraction_options})``.
        model: a pydantic model class: its fields are the facts. Stored values are its
            fields' JSON form (``model_dump(mode="json")``), keyed by field name.
        user_id: the signed-in user's id, or a resolver ``callable(session) -> str`` called on
            every run. Required; there is no fallback. The facts' scope (default
            ``MemoryScope(user_id=...)``: facts outlive a conversation) is recorded in the
            provider's state, and a session whose record differs is refused with
            :class:`~pgmemory.errors.ScopeError` before anything is read or written.
        scope: optional ``callable(user_id, session) -> MemoryScope`` for another scope (e.g.
            with an ``application_id``); it must carry the bound user id.
        namespace: the facts' namespace in the store (default: ``source_id``), so several
            fact providers can share a scope without clashing.
        required: field names the agent must ask for while they are unknown. Default: the
            model's required fields (``name: str | None`` without a default is required; with
            ``= None`` it is not). Pass ``()`` to never ask.
        source_id: the provider's id (default ``"fact_memory"``, :data:`FACTS_NAMESPACE`); the
            key of its state in ``session.state`` and the ``actor`` of every audit row.
        facts_prompt: the header of the injected facts (:data:`DEFAULT_FACTS_PROMPT`).
        missing_prompt: the request for missing required facts, with ``{fields}``
            (:data:`DEFAULT_MISSING_PROMPT`).
        extraction_prompt: the system instruction of the extraction request
            (:data:`DEFAULT_EXTRACTION_PROMPT`).
        extraction_options: extra request options for the extraction call (e.g.
            ``{"model": "gpt-4o-mini", "temperature": 0}``).
        store_input_filter: which request messages are mined for facts (default: only the
            caller's own, ``external``, messages); of those, only ``user`` messages with text
            are used.
        extract_when: when a run's user messages are sent to the model for extraction:
            ``"likely"`` (default) while a required fact is unknown (the agent asks for it,
            so the next answer may be a bare "Dana."), and otherwise only when a cheap local
            check says a message may state a fact (a first-person statement or a word of a
            field's name; see :mod:`~pgmemory.integrations.agent_framework.fact_trigger`);
            ``"until_known"`` only while a required fact (every field, when none is required)
            is unknown, as the seeds do, so later corrections are missed; ``"always"`` after
            every run with user text.
        extraction: ``"turn"`` (default): the model is called as the after-run phase begins;
            ``"queued"``: the turn queues a job instead (in its own transaction) and a worker
            extracts later (see the module's docs; :meth:`process_now`, :meth:`flush`).
        extraction_delay_s: ``"queued"``: how long a turn's job waits before a worker takes
            it (default 0); the user's turns meanwhile join it, in one model call.
        profile: also keep a summary of the user (``"queued"`` only), at most
            ``profile_max_chars`` characters, injected under ``profile_prompt``
            (:data:`DEFAULT_PROFILE_PROMPT`).

    Raises:
        InvalidInputError: an argument is unusable (the message names it and the fix).
    """

    @dataclass(frozen=True, slots=True)
    class State:
        """The provider's per-session state: the scope its facts belong to."""

        scope: MemoryScope

        def to_dict(self) -> dict[str, Any]:
            """JSON-native form, as kept in the session state."""
            return {"scope": self.scope.to_dict()}

        @classmethod
        def from_dict(cls, data: Mapping[str, Any]) -> FactMemoryProvider.State:
            """Inverse of :meth:`to_dict`."""
            scope = data.get("scope")
            if not isinstance(scope, Mapping):
                raise InvalidInputError(
                    "fact memory state has no 'scope' mapping; was the session made by an "
                    "agent with a different configuration?"
                )
            return cls(scope=MemoryScope.from_dict(scope))

    def __init__(
        self,
        store: MemoryStore,
        chat_client: Any,
        model: type[BaseModel],
        *,
        user_id: UserId,
        scope: Callable[[str, AgentSession], MemoryScope] | None = None,
        namespace: str | None = None,
        required: Sequence[str] | None = None,
        source_id: str = FACTS_NAMESPACE,
        facts_prompt: str = DEFAULT_FACTS_PROMPT,
        missing_prompt: str = DEFAULT_MISSING_PROMPT,
        extraction_prompt: str = DEFAULT_EXTRACTION_PROMPT,
        extraction_options: Mapping[str, Any] | None = None,
        store_input_filter: MessageFilter = external_only,
        extract_when: ExtractWhen = "likely",
        extraction: Extraction = "turn",
        profile: bool = False,
        profile_max_chars: int = 600,
        profile_prompt: str = DEFAULT_PROFILE_PROMPT,
        extraction_delay_s: float = 0.0,
    ) -> None:
        super().__init__(source_id)
        self._user_id = check_user_id(user_id)
        check_callable(scope, "scope", "a callable(user_id, session) -> MemoryScope")
        check_callable(store_input_filter, "store_input_filter", "a callable(messages) -> messages")
        self.store_input_filter = store_input_filter
        for method in ("get_facts", "merge_facts"):
            if not callable(getattr(store, method, None)):
                raise InvalidInputError(
                    f"store {store!r} has no {method}(); pass a pgmemory MemoryStore"
                )
        if not callable(getattr(chat_client, "get_response", None)):
            raise InvalidInputError(
                f"chat_client {chat_client!r} has no get_response(); pass an agent-framework "
                "chat client such as agent_framework.openai.OpenAIChatCompletionClient"
            )
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            raise InvalidInputError(
                f"model must be a pydantic BaseModel subclass (e.g. class UserInfo(BaseModel): "
                f"name: str | None), got {model!r}"
            )
        if not model.model_fields:
            raise InvalidInputError(f"model {model.__name__} has no fields; declare the facts")
        if namespace is not None and (not isinstance(namespace, str) or not namespace.strip()):
            raise InvalidInputError(f"namespace {namespace!r} is blank; pass a name or omit it")
        if required is None:
            required_fields = [n for n, f in model.model_fields.items() if f.is_required()]
        else:
            if isinstance(required, str):
                raise InvalidInputError(
                    f"required={required!r} is a string; pass a list of field names, "
                    f"e.g. [{required!r}]"
                )
            required_fields = list(required)
            unknown = [n for n in required_fields if n not in model.model_fields]
            if unknown:
                raise InvalidInputError(
                    f"required names {unknown} are not fields of {model.__name__}; "
                    f"its fields are {list(model.model_fields)}"
                )
        if extraction not in EXTRACTION:
            raise InvalidInputError(
                f"extraction is {extraction!r}; expected one of {', '.join(EXTRACTION)}"
            )
        if profile and extraction != "queued":
            raise InvalidInputError(
                "profile=True needs extraction='queued' (the profile is kept off the turn)"
            )
        if extraction_delay_s and extraction != "queued":
            raise InvalidInputError("extraction_delay_s needs extraction='queued'")
        if PROFILE_FIELD in model.model_fields:
            raise InvalidInputError(
                f"{model.__name__} has a field named {PROFILE_FIELD!r}, which the extraction "
                "uses for the profile; rename the field"
            )
        if type(profile_max_chars) is not int or not 20 <= profile_max_chars <= 4000:
            raise InvalidInputError(
                f"profile_max_chars must be an int from 20 to 4000, got {profile_max_chars!r}"
            )
        for what, value in (
            ("profile_prompt", profile_prompt),
            ("facts_prompt", facts_prompt),
            ("missing_prompt", missing_prompt),
            ("extraction_prompt", extraction_prompt),
        ):
            if not isinstance(value, str) or not value.strip():
                raise InvalidInputError(f"{what} must be a non-blank string")
        if extract_when not in EXTRACT_WHEN:
            raise InvalidInputError(
                f"extract_when is {extract_when!r}; expected one of {', '.join(EXTRACT_WHEN)}"
            )
        if "{fields}" not in missing_prompt:
            raise InvalidInputError(
                "missing_prompt must contain '{fields}', where the missing facts are listed"
            )
        self.store = store
        self.chat_client = chat_client
        self.model = model
        self.namespace: str = namespace or source_id
        self.required: tuple[str, ...] = tuple(dict.fromkeys(required_fields))
        self.facts_prompt = facts_prompt
        self.missing_prompt = missing_prompt
        self.extraction: Extraction = extraction
        self.profile = bool(profile)
        self.profile_max_chars = profile_max_chars
        self.profile_prompt = profile_prompt
        self.extraction_delay_s = check_number(
            extraction_delay_s, what="extraction_delay_s", low=0, high=MAX_DELAY_S
        )
        self.extraction_prompt = extraction_prompt + (
            PROFILE_INSTRUCTION.format(field=PROFILE_FIELD, chars=profile_max_chars)
            if profile
            else ""
        )
        #: The derivation queue (``extraction="queued"``).
        self.queue = JobQueue(store.database) if extraction == "queued" else None
        self.extraction_options: dict[str, Any] = dict(extraction_options or {})
        #: ``model`` with every field nullable: the shape the extraction asks for.
        self.extraction_model: type[BaseModel] = extraction_model(model)
        if profile:
            self.extraction_model = with_profile(self.extraction_model, profile_max_chars)
        #: The extraction request's ``response_format``: a strict JSON schema of
        #: :attr:`extraction_model`. It is sent as a raw schema (decoded, not parsed, by the
        #: client) so each value is validated on its own and one bad value loses only itself.
        self.response_format: dict[str, Any] = response_format(self.extraction_model)
        self._scope = scope
        self.extract_when: ExtractWhen = extract_when
        #: The facts watched by ``extract_when="until_known"``.
        self._watched: tuple[str, ...] = self.required or tuple(model.model_fields)
        self._field_words = field_words(model.model_fields)
        #: Where :meth:`unit_of_work` leaves the facts it extracted for :meth:`after_run`.
        self._extracted_key = f"pgmemory.facts.{source_id}.extracted"
        #: Where :meth:`before_run` notes whether a watched fact is unknown ("until_known").
        self._unknown_key = f"pgmemory.facts.{source_id}.unknown"

    # --- state -----------------------------------------------------------------------------

    def __repr__(self) -> str:
        return (
            f"FactMemoryProvider(source_id={self.source_id!r}, model={self.model.__name__}, "
            f"namespace={self.namespace!r})"
        )

    def get_state(
        self, session: AgentSession, state: dict[str, Any] | None = None
    ) -> FactMemoryProvider.State:
        """The session's state, derived now from the bound user id, and recorded.

        Args:
            session: the session.
            state: the provider-scoped state (the hooks' ``state``; default: the session's
                entry under :attr:`source_id`). Only compared and recorded, never trusted.

        Raises:
            ScopeError: no user id is bound, the scope does not carry it, or the session's
                recorded scope differs from the derived one.
        """
        derived = self._derived_state(session)
        bind_state(provider_state(session, self) if state is None else state, self, derived)
        return self.State.from_dict(derived)

    def _derived_state(self, session: AgentSession) -> dict[str, Any]:
        """The facts' scope from the bound user id, checked, JSON-native."""
        user = resolve_user_id(self._user_id, session, self)
        value = MemoryScope(user_id=user) if self._scope is None else self._scope(user, session)
        if not isinstance(value, MemoryScope):
            raise InvalidInputError(
                f"scope returned a {type(value).__name__}; return a MemoryScope "
                "(e.g. MemoryScope(user_id=user_id, application_id='shop'))"
            )
        if value.user_id != user:
            raise ScopeError(
                f"{self!r}: the scope from scope() does not carry the bound user id, so facts "
                "would be shared with other users; set MemoryScope(user_id=user_id, ...)"
            )
        return self.State(scope=value).to_dict()

    async def get_facts(self, session: AgentSession) -> dict[str, Any]:
        """The facts known for the session's scope (JSON values, keyed by field name)."""
        scope = self.get_state(session).scope
        return self._known(await self.store.get_facts(self.namespace, scope))

    def _known(self, stored: Mapping[str, Any]) -> dict[str, Any]:
        """The stored facts that are fields of the model, in field order (stale keys dropped)."""
        return {
            name: stored[name]
            for name in self.model.model_fields
            if name in stored and stored[name] is not None
        }

    # --- before the model ------------------------------------------------------------------

    def _label(self, name: str) -> str:
        info = self.model.model_fields[name]
        label = name.replace("_", " ")
        return f"{label} ({info.description})" if info.description else label

    def format_instructions(self, facts: Mapping[str, Any]) -> list[str]:
        """The instructions injected for ``facts`` (the known facts, then what to ask for)."""
        known = self._known(facts)
        parts: list[str] = []
        profile = facts.get(PROFILE_KEY) if self.profile else None
        if isinstance(profile, str) and profile.strip():
            parts.append(f"{self.profile_prompt}\n{json_text(profile)}")
        if known:
            encoded = json_text(known, separators=(", ", ": "))
            parts.append(f"{self.facts_prompt}\n{encoded}")
        missing = [name for name in self.required if name not in known]
        if missing:
            fields = ", ".join(self._label(name) for name in missing)
            parts.append(self.missing_prompt.format(fields=fields))
        return parts

    async def before_run(
        self,
        *,
        agent: Any,
        session: AgentSession,
        context: SessionContext,
        state: dict[str, Any],
    ) -> None:
        """Check the run (``check_run``), inject the known facts, ask for missing required ones."""
        check_run(self, agent=agent, context=context)
        scope = self.get_state(session, state).scope
        stored = await self.store.get_facts(self.namespace, scope)
        known = self._known(stored)
        context.extend_instructions(self.source_id, self.format_instructions(stored))
        context.metadata[self._unknown_key] = [n for n in self.model.model_fields if n not in known]
        logger.info(
            "fact memory %s: injected %d known fact(s), %d required missing",
            self.source_id,
            len(known),
            sum(1 for name in self.required if name not in known),
        )

    # --- after the model -------------------------------------------------------------------

    def mined_messages(self, context: SessionContext) -> list[Message]:
        """The request messages mined for facts, as the caller passed them: through
        ``store_input_filter`` (default: the caller's own), user role, non-blank text; each
        given its id (the one the history providers store it under)."""
        chosen = self.store_input_filter(context.get_messages(include_input=True))
        mined = [m for m in chosen if m.role == "user" and m.text.strip()]
        for message in mined:
            ensure_identity(message)
        return mined

    def extraction_messages(self, context: SessionContext) -> list[Message]:
        """The text of :meth:`mined_messages`, as the user messages of an extraction request."""
        return user_messages(m.text for m in self.mined_messages(context))

    def wants_extraction(self, context: SessionContext, messages: Sequence[Message]) -> bool:
        """Whether ``extract_when`` calls the model for these messages (see the class)."""
        if not messages:
            return False
        if self.extract_when == "always":
            return True
        # every fact counts as unknown when before_run did not look: the safe side
        unknown = set(context.metadata.get(self._unknown_key, self.model.model_fields))
        if self.extract_when == "until_known":
            return any(name in unknown for name in self._watched)
        # "likely": the answer to the agent's request for a required fact, or a turn the
        # local check flags
        return any(name in unknown for name in self.required) or any(
            may_state_fact(m.text, self._field_words) for m in messages
        )

    async def extract(
        self, messages: Sequence[Message], *, known: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """Ask the chat model for the facts stated in ``messages``; returns the validated,
        JSON-native values it found (fields it left null are absent), and the updated profile
        under :data:`PROFILE_KEY` when the provider keeps one.

        ``known``: the stored facts (and profile), shown to the model as data so that it
        returns what is new or contradicted (a queued extraction passes them).

        Raises whatever the chat client raises, or :class:`InvalidInputError` when the reply is
        not a JSON object.
        """
        with telemetry.operation(
            telemetry.UPDATE_MEMORY, settings=self.store.settings, kind="facts"
        ) as op:
            request = [Message("system", [self.extraction_prompt])]
            known = known or {}
            shown = self._known(known)
            if self.profile and isinstance(known.get(PROFILE_KEY), str):
                shown[PROFILE_FIELD] = known[PROFILE_KEY]
            if shown:
                request.append(Message("system", [f"{KNOWN_FACTS_PROMPT}\n{json_text(shown)}"]))
            reply = await self.chat_client.get_response(
                [*request, *messages],
                options={**self.extraction_options, "response_format": self.response_format},
            )
            try:
                value = json.loads(reply.text or "null")
            except ValueError:
                raise InvalidInputError("the extraction reply is not JSON") from None
            if not isinstance(value, Mapping):
                raise InvalidInputError(
                    f"the extraction reply held {type(value).__name__}, not an object of facts"
                )
            raw = dict(value)
            facts = validate_values(self.model, raw, owner=self.source_id)
            summary = raw.get(PROFILE_FIELD) if self.profile else None
            if isinstance(summary, str) and summary.strip():
                summary, limit = " ".join(summary.split()), self.profile_max_chars
                facts[PROFILE_KEY] = summary[: limit - 1] + "…" if len(summary) > limit else summary
            op.count("facts.extracted", len(facts))
            return facts

    async def after_run(
        self,
        *,
        agent: Any,
        session: AgentSession,
        context: SessionContext,
        state: dict[str, Any],
    ) -> None:
        """Merge the facts of this run's user messages, in the turn's one transaction with the
        other pgmemory providers' writes (the framework calls this only after a successful
        model call)."""
        await after_run_together(self, agent=agent, session=session, context=context, state=state)

    async def write_turn(
        self, *, agent: Any, session: AgentSession, context: SessionContext, state: dict[str, Any]
    ) -> None:
        """Merge what :meth:`unit_of_work` extracted (or extract now, when called alone)."""
        scope = self.get_state(session, state).scope
        mined = self.mined_messages(context)
        messages = user_messages(m.text for m in mined)
        if not messages:
            logger.debug("fact memory %s: no user text, extraction skipped", self.source_id)
            return
        sources = {"message_ids": [m.message_id for m in mined]}
        if self.queue is not None:
            if self.wants_extraction(context, messages):
                texts = [{"text": m.text, "message_id": m.message_id} for m in mined]
                await self.queue.enqueue(
                    self.namespace, scope, {"messages": texts}, delay_s=self.extraction_delay_s
                )
                logger.info("fact memory %s: queued %d message(s)", self.source_id, len(texts))
            return
        if self._extracted_key in context.metadata:
            updates = context.metadata.pop(self._extracted_key)
        elif not self.wants_extraction(context, messages):
            logger.debug(
                "fact memory %s: extraction not needed (%s)", self.source_id, self.extract_when
            )
            return
        else:
            updates = await self._extract_quietly(messages)
        if updates is None:
            return
        if not updates:
            logger.info(
                "fact memory %s: no facts found in %d message(s)", self.source_id, len(messages)
            )
            return
        await self.store.merge_facts(
            self.namespace, scope, updates, actor=self.source_id, sources=sources
        )
        logger.info(
            "fact memory %s: merged %d extracted fact(s) (%s)",
            self.source_id,
            len(updates),
            ", ".join(updates),
        )

    def unit_of_work(self, context: SessionContext) -> AbstractAsyncContextManager[None]:
        """Extract the turn's facts (a model call, before any transaction opens), then join the
        store's shared transaction: the merge is kept with the rest of the turn, or not at all."""
        return self._extract_then_join(context)

    @asynccontextmanager
    async def _extract_then_join(self, context: SessionContext) -> AsyncIterator[None]:
        messages = self.extraction_messages(context) if self.queue is None else []
        if self.wants_extraction(context, messages):
            context.metadata[self._extracted_key] = await self._extract_quietly(messages)
        async with self.store.shared_transaction(deferred=True):
            yield

    # --- queued extraction -------------------------------------------------------------------

    async def process_now(self) -> int:
        """Extract every pending job of this provider's namespace now (those waiting for
        ``extraction_delay_s`` too), in this process; returns the jobs done (``extraction="queued"``; see
        :class:`~pgmemory.integrations.agent_framework.fact_worker.FactWorker`)."""
        from pgmemory.integrations.agent_framework.fact_worker import FactWorker

        return await FactWorker([self]).run_once(early=True)

    async def flush(self, timeout: float = 30.0) -> None:
        """Return once no job of this provider's namespace is pending, processing due ones here
        (others may be leased by a worker elsewhere); raises TimeoutError after ``timeout``
        seconds, naming how many are left."""
        from pgmemory.integrations.agent_framework.fact_worker import FactWorker

        await FactWorker([self]).flush(timeout)

    async def _extract_quietly(self, messages: Sequence[Message]) -> dict[str, Any] | None:
        """:meth:`extract`, or None (logged by exception type only) when it failed: an
        extraction must never fail the user's run."""
        try:
            return await self.extract(messages)
        except Exception as exc:
            logger.warning(
                "fact memory %s: extraction failed (%s); facts unchanged",
                self.source_id,
                type(exc).__name__,
            )
            return None


__all__ = ["FactMemoryProvider"]  # its prompts and keys: fact_prompts
