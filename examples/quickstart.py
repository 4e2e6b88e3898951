"""Quickstart: scoped memories for two users, in Chinese and English, on the embedded server.

    python examples/quickstart.py     # needs pgmemory-agents[local]: the embedded server + USE

Starts (or reuses) the embedded PostgreSQL under PGMEMORY_DATA_DIR, migrates, stores a few
memories for Alice and Bob, then recalls within each user's scope, with similarity scores.
"""

from __future__ import annotations

import asyncio
import time

from pgmemory import MemoryRecord, MemoryScope, MemoryStore
from pgmemory.store.modes import DEFAULT_MODE, MODES

MEMORIES = {
    "alice": [
        "我不能吃辣，点菜请避开辣椒。",
        "我喜欢清淡的菜，比如清蒸鲈鱼和番茄炒蛋。",
        "I usually order lunch around noon at the office.",
    ],
    "bob": [
        "I love spicy food: the hotter the better.",
        "上次我点了辣椒炒肉和剁椒鱼头，很好吃。",
        "Bob is allergic to peanuts.",
    ],
}
QUERIES = ["帮我点一份外卖", "What should I avoid ordering?", "Does the user like spicy dishes?"]


async def main() -> None:
    started = time.perf_counter()
    async with MemoryStore(migrate=True) as store:
        print(f"database ready in {time.perf_counter() - started:.1f}s")
        await store.create_collection("quickstart")
        for user, texts in MEMORIES.items():
            scope = MemoryScope(user_id=f"demo-{user}")
            await store.delete("quickstart", scope=scope, actor="quickstart")  # rerunnable
            await store.add(
                "quickstart",
                [MemoryRecord(content=t, scope=scope) for t in texts],
                actor="quickstart",
            )
            print(f"stored {len(texts)} memories for {user}")
        print(f"\nscores ({DEFAULT_MODE} search, the default): {MODES[DEFAULT_MODE].scale}")
        for user in MEMORIES:
            scope = MemoryScope(user_id=f"demo-{user}")
            print(f"\n=== recall for {user} (search scope: user_id=demo-{user}) ===")
            for query in QUERIES:
                print(f"? {query}")
                for hit in await store.search("quickstart", scope, query=query, limit=2):
                    owner = hit.memory.scope.user_id
                    print(f"  {hit.score:+.3f}  [{owner}] {hit.memory.content}")
                    assert owner == f"demo-{user}", "a user saw another user's memory"
        print("\nneither user recalled the other's memories.")


if __name__ == "__main__":
    asyncio.run(main())
