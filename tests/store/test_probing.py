"""Probes beside the searches (:mod:`pgmemory.store.probing`): when one is due, and how its task
behaves."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from pgmemory.store import probing


def test_a_probe_is_due_after_its_searches_and_its_interval() -> None:
    now = time.monotonic()
    assert not probing.due(1_000, 1_000, now - 3_600)  # not more than 1,000 searches yet
    assert not probing.due(1_001, 1_000, now)  # probed a moment ago
    assert probing.due(1_001, 1_000, now - probing.PROBE_INTERVAL_S)


async def test_one_probe_a_key_at_a_time_and_a_failing_one_is_logged_by_class(
    caplog: pytest.LogCaptureFixture,
) -> None:
    beside, release, runs = probing.Beside(), asyncio.Event(), []

    async def probe() -> None:
        runs.append(1)
        await release.wait()
        raise KeyError("user-42")  # e.g. its path was disabled meanwhile

    with caplog.at_level(logging.WARNING, logger="pgmemory"):
        beside.start("ann c", probe)
        beside.start("ann c", probe)  # running: not started again
        await asyncio.sleep(0)
        assert runs == [1] and beside.running("ann c")
        release.set()
        await beside.settle()
    assert not beside.running("ann c")
    assert [r.getMessage() for r in caplog.records] == [
        "a recall probe beside the searches failed (KeyError)"
    ]
    await beside.close()
