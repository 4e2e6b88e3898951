"""How far a statement is from the call that sends it: pgmemory's frames on the stack each time
the driver executes, for a real provider turn and a real recall (issue 56).

A profiler (``sys.setprofile``) watches for psycopg's ``AsyncCursor.execute`` and
``executemany``, the calls every statement goes through (SQLAlchemy's and the fast path's
alike), and records the pgmemory frames above it, outermost first. Of each walk it reports the
frames, the files, and the files entered again after the walk had left them (a call back up
the layers).

The ceilings are the walks as they are at d7307c6 (the turn's write crosses 30 files; the
statements it sends at its commit are 10 frames below the hook, its deepest stack 17 frames,
re-entering ``history.py``; the recall 12 frames to its statement; the history read 13); the
execution-layer work of issue 56 aims at a write of at most 8 frames over at most 10 files,
none re-entered, and a recall of at most 6, and lowers them as it gets there: at b4747e8 (the
deployment chosen once, the unit of work calling no verb of the database) the write is 9 frames
over 4 files, the recall still 12 over 7, the history read 12 over 7. ``pytest -s`` prints the
walks.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType
from typing import Any

import psycopg

import pgmemory

#: pgmemory's package directory: a frame whose file is under it is pgmemory's.
_PACKAGE = os.path.dirname(pgmemory.__file__) + os.sep
#: The driver's calls that send a statement.
_SENDS = {psycopg.AsyncCursor.execute.__code__, psycopg.AsyncCursor.executemany.__code__}

#: The ceilings of each phase: the frames, files and files re-entered of its longest walk to a
#: statement, the frames of its deepest stack, and the files it crossed (one more since the
#: connections left database.py for a module of their own: a file crossed, no frame added).
#: On Citus a recall writes its audit row apart, in a transaction of its own: one file more
#: crossed there (unit_of_work.py's locks); its walk is 6 frames on both. The write and the
#: recall cross one file more since the embedder wrappers' model id is defined once, on their
#: base (embedders/base.py's WrappingEmbedder: a property read, no frame on any walk to a
#: statement): the recall 30 on one server, 31 on Citus (run alone: text/stem.py's cache cold).
#: The recall two more since it is a typed request (store/requests.py's RecallRequest, which
#: the provider's options build: chat_history_options.py), checked before the walk to its
#: statement, which is unchanged: 32 on one server, 33 on Citus.
WRITE_CEILING = (6, 4, 0, 17, 32)
RECALL_CEILING = (6, 6, 0, 9, 33)
HISTORY_CEILING = (7, 6, 0, 9, 16)


@dataclass(frozen=True)
class Walk:
    """pgmemory's frames above one statement the driver executed, outermost first."""

    frames: tuple[tuple[str, str], ...]  # (file under pgmemory/, function)

    @property
    def files(self) -> list[str]:
        return sorted({file for file, _ in self.frames})

    @property
    def reentered(self) -> list[str]:
        """Files the walk came back to after leaving them for another file."""
        seen: list[str] = []
        again: set[str] = set()
        for file, _ in self.frames:
            if seen and seen[-1] == file:
                continue
            if file in seen:
                again.add(file)
            seen.append(file)
        return sorted(again)

    def size(self) -> tuple[int, int, int]:
        return (len(self.frames), len(self.files), len(self.reentered))

    def render(self) -> str:
        lines = [f"  {file}:{function}" for file, function in self.frames]
        frames, files, again = self.size()
        return "\n".join(
            [f"{frames} frames over {files} files, re-entered {again}: {self.reentered}", *lines]
        )


@dataclass
class Recording:
    """What a block did: a :class:`Walk` per statement the driver executed, and every
    pgmemory file a function of which ran (the files the block crossed)."""

    walks: list[Walk]
    files: set[str]
    #: The deepest stack of pgmemory frames any call of the block had.
    deepest: Walk = Walk(())


def _ours(frame: FrameType | None) -> Walk:
    """The pgmemory frames of the stack from ``frame`` outwards, outermost first."""
    ours: list[tuple[str, str]] = []
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith(_PACKAGE):
            ours.append((name[len(_PACKAGE) :], frame.f_code.co_qualname))
        frame = frame.f_back
    return Walk(tuple(reversed(ours)))


@contextmanager
def recording() -> Iterator[Recording]:
    """Record what the block runs (see :class:`Recording`)."""
    seen = Recording([], set())
    walks = seen.walks

    def profile(frame: FrameType, event: str, _arg: Any) -> None:
        if event != "call":
            return
        if frame.f_code.co_filename.startswith(_PACKAGE):
            seen.files.add(frame.f_code.co_filename[len(_PACKAGE) :])
            stack = _ours(frame)
            if len(stack.frames) > len(seen.deepest.frames):
                seen.deepest = stack
            return
        if frame.f_code not in _SENDS:
            return
        walks.append(_ours(frame.f_back))

    sys.setprofile(profile)
    try:
        yield seen
    finally:
        sys.setprofile(None)


def longest(walks: list[Walk]) -> Walk:
    """The walk with the most frames (the first of them)."""
    assert walks, "no statement was executed"
    return max(walks, key=lambda walk: len(walk.frames))


async def walks_of_a_turn(store: Any, collection: str) -> dict[str, Recording]:
    """What the third of three provider turns ran (the first ones warm what is made once):
    agent-framework's ``Agent`` with the default providers and a scripted model over HTTP.
    By phase: ``write`` (both providers' after_run: the turn's one transaction), ``recall``
    (the memory provider's before_run) and ``history`` (the history provider's)."""
    from pgmemory import ChatHistoryMemoryProvider, PostgresHistoryProvider
    from tests.agents import agent
    from tests.openai_server import OpenAIServer, text

    user = f"walker-{uuid.uuid4().hex[:8]}"
    with OpenAIServer() as server:
        memory = ChatHistoryMemoryProvider(store, collection, user_id=user)
        history = PostgresHistoryProvider(store, user_id=user)
        runner = agent(server, history, memory)
        for turn in range(3):
            session = runner.create_session(session_id=f"s-{turn}")
            server.queue(text("Noted."))
            phases = {
                "write": Recording([], set()),
                "recall": Recording([], set()),
                "history": Recording([], set()),
            }
            _record(history, "after_run", phases["write"])
            _record(memory, "after_run", phases["write"])
            _record(memory, "before_run", phases["recall"])
            _record(history, "before_run", phases["history"])
            await runner.run(f"I like tea number {turn}", session=session)
    return phases


def _record(provider: Any, hook: str, into: Recording) -> None:
    """Record what ``provider``'s ``hook`` runs into ``into`` (wrapping it on the instance)."""
    original: Callable[..., Awaitable[Any]] = getattr(type(provider), hook)

    async def recorded(*args: Any, **kwargs: Any) -> Any:
        with recording() as seen:
            try:
                return await original(provider, *args, **kwargs)
            finally:
                into.walks.extend(seen.walks)
                into.files |= seen.files
                if len(seen.deepest.frames) > len(into.deepest.frames):
                    into.deepest = seen.deepest

    setattr(provider, hook, recorded)


def _check(seen: Recording, ceiling: tuple[int, int, int, int], what: str) -> None:
    walk = longest(seen.walks)
    size = (*walk.size(), len(seen.deepest.frames), len(seen.files))
    assert all(n <= most for n, most in zip(size, ceiling, strict=True)), (
        f"{what} grew past {ceiling} (frames, files and files re-entered on the longest walk "
        f"to a statement; the deepest stack; files crossed): {size}\n{walk.render()}\n"
        f"deepest: {seen.deepest.render()}\ncrossed: {sorted(seen.files)}"
    )


async def test_a_turns_write_and_recall_are_no_longer_walks_than_today(
    store: Any, collection: str
) -> None:
    phases = await walks_of_a_turn(store, collection)
    for name, seen in phases.items():
        print(
            f"{name}: {len(seen.walks)} statements, {len(seen.files)} files crossed "
            f"{sorted(seen.files)}; the longest walk to a statement:\n"
            f"{longest(seen.walks).render()}\nthe deepest stack: {seen.deepest.render()}"
        )
    _check(phases["write"], WRITE_CEILING, "the write")
    _check(phases["recall"], RECALL_CEILING, "the recall")
    _check(phases["history"], HISTORY_CEILING, "the history read")
