"""How many model calls does fact extraction make, per ``extract_when`` policy and in the turn
or queued, which facts does each miss, and what does the extraction cost the turn?

    .venv/bin/python bench/retrieval/fact_calls.py            # ~1 min

Two conversations, each run once per policy (``always``, ``until_known``, ``likely``) on a
scratch database (created and dropped), every turn in a fresh session:

* ``food``: the food-delivery demo's script and agent (agent-framework's ``Agent``,
  chat-history memory, GetMenu and PlaceOrder, the demo's offline stand-in model over HTTP)
  plus a fact provider for the diner's dietary
  restrictions (no required fact). Alice states "我不能吃辣" once, then she and Bob only say
  "帮我点一份外卖".
* ``chat``: a scripted 20-turn English conversation with the seeds' ``UserInfo`` (name and
  age required) plus an optional city: terse answers to the agent's request for the missing
  facts, small talk, questions, three corrections (one of them stated without a first-person
  word or a field word).

The extraction "model" is a stand-in that answers from the script's own table of what each
user message states, so the facts stored are exactly what a perfect extractor would find when
called; a fact is missed when its message was never sent. Each extraction call takes
``--model-ms`` (default 300 ms, a small hosted model's answer), the agent's own calls none.

Each policy runs with ``extraction="turn"`` and with ``extraction="queued"``: the worker
(``process_now``) runs after every turn (``queued``), or once after the whole chat
(``queued-batch``: one call per user). The turn's wall time (``agent.run``, p50) is measured
for each, side by side in the one run.

A third conversation, ``moves``, checks consolidation: a user states a city, then contradicts
it twice (once without the city's name in the first sentence). Its extractor does not replay a
table: it reads the messages with a few rules and keeps the last value it finds, so a batch is
right only if the worker gives it the messages oldest first.

Prints a table of model calls (extraction calls, and the agent's own calls for scale), missed
facts and turn time.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import re
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root (bench/_common)

from agent_framework import Agent
from agent_framework.openai import OpenAIChatCompletionClient
from pydantic import BaseModel, Field

from bench._common.paths import ROOT
from bench._common.scratch import Server
from pgmemory import (
    FactMemoryProvider,
    MemoryScope,
    MemoryStore,
    Settings,
)
from pgmemory.integrations.agent_framework.fact_trigger import EXTRACT_WHEN

_spec = importlib.util.spec_from_file_location(
    "food_delivery", ROOT / "examples" / "food_delivery.py"
)
food = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
_spec.loader.exec_module(food)  # type: ignore[union-attr]


class DinerFacts(BaseModel):
    dietary_restrictions: str | None = Field(
        default=None, description="foods the user cannot or will not eat"
    )


class UserInfo(BaseModel):
    name: str | None
    age: int | None
    city: str | None = None


#: (user, message, facts the message states)
FOOD: list[tuple[str, str, dict[str, Any]]] = [
    (user, text, {"dietary_restrictions": "不能吃辣"} if "不能吃辣" in text else {})
    for user, text in food.SCRIPT
]

CHAT: list[tuple[str, str, dict[str, Any]]] = [
    ("dana", "Hi there!", {}),
    ("dana", "Can you recommend a good book?", {}),
    ("dana", "Dana.", {"name": "Dana"}),  # the agent asked for the name
    ("dana", "What's the weather like in spring?", {}),
    ("dana", "34", {"age": 34}),  # the agent asked for the age
    ("dana", "Thanks, that helps.", {}),
    ("dana", "What should I cook tonight?", {}),
    ("dana", "Tell me a joke.", {}),
    ("dana", "I live in Lisbon.", {"city": "Lisbon"}),
    ("dana", "How far is Porto from here?", {}),
    ("dana", "Summarise our chat so far.", {}),
    ("dana", "Moved to Berlin last month, by the way.", {"city": "Berlin"}),
    ("dana", "Any museums worth a visit?", {}),
    ("dana", "Great, thanks!", {}),
    ("dana", "Which one opens earliest?", {}),
    ("dana", "I just turned 35 today!", {"age": 35}),
    ("dana", "Suggest a birthday dinner spot.", {}),
    ("dana", "Book a table for two at eight.", {}),
    ("dana", "Please call me Dee from now on.", {"name": "Dee"}),
    ("dana", "Goodbye!", {}),
]


MOVES: list[tuple[str, str, dict[str, Any]]] = [
    ("mo", "Hello!", {}),
    ("mo", "I live in Lisbon.", {"city": "Lisbon"}),
    ("mo", "Any good bakeries around?", {}),
    ("mo", "Moved to Berlin last month, by the way.", {"city": "Berlin"}),
    ("mo", "Which museums open on Mondays?", {}),
    ("mo", "Not Berlin any more. These days I am in Porto.", {"city": "Porto"}),
    ("mo", "Thanks!", {}),
]

SCRIPTS = {"food": FOOD, "chat": CHAT, "moves": MOVES}

#: The rules of the ``moves`` extractor: a city after one of these phrases.
_CITY = re.compile(r"\b(?:live in|moved to|am in|living in)\s+([A-Z][a-z]+)")


def read_city(messages: list[str]) -> dict[str, Any]:
    """The city the messages state last, read by rules (no table of the script)."""
    found = [m.group(1) for text in messages for m in _CITY.finditer(text)]
    return {"city": found[-1]} if found else {}


class Extractor:
    """The stand-in model's answers: extraction requests (a ``response_format``) are counted,
    take ``delay_s``, and are answered from the script's table (or by ``reader``); every other
    request gets ``inner(body)``."""

    def __init__(
        self, inner: Any, table: dict[str, dict[str, Any]], delay_s: float, reader: Any = None
    ) -> None:
        self.inner = inner
        self.table = table
        self.delay_s = delay_s
        self.reader = reader
        self.extraction_calls = 0
        self.agent_calls = 0

    def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        if not body.get("response_format"):
            self.agent_calls += 1
            return self.inner(body)
        self.extraction_calls += 1
        time.sleep(self.delay_s)
        said = [str(m.get("content") or "") for m in body["messages"] if m["role"] == "user"]
        if self.reader is not None:
            return {"text": json.dumps(self.reader(said))}
        facts: dict[str, Any] = {}
        for content in said:
            facts.update(self.table.get(content, {}))
        return {"text": json.dumps(facts)}


def small(body: dict[str, Any]) -> dict[str, Any]:
    """The agent's model in the chat scenario: a short reply."""
    return {"text": "Sure."}


async def run(
    url: str, scenario: str, policy: str, mode: str, delay_s: float
) -> tuple[int, int, list[str], list[float]]:
    script = SCRIPTS[scenario]
    model: type[BaseModel] = DinerFacts if scenario == "food" else UserInfo
    answers = Extractor(
        food.step_for if scenario == "food" else small,
        {t: f for _, t, f in script},
        delay_s,
        read_city if scenario == "moves" else None,
    )
    server, base_url = food.serve_stand_in(answers)
    client = OpenAIChatCompletionClient(model="stand-in", base_url=base_url, api_key="offline")
    run_id = uuid.uuid4().hex[:6]
    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    user = food.current_user  # each turn's user is bound through food.CURRENT_USER
    try:
        async with MemoryStore(url, settings=settings) as store:
            facts = FactMemoryProvider(
                store,
                client,
                model,
                user_id=user,
                extract_when=policy,  # type: ignore[arg-type]
                extraction="turn" if mode == "turn" else "queued",
                namespace=f"facts_{mode}",
            )
            if scenario == "food":
                agent = food.build_agent(client, store, user_id=user)
                agent.context_providers.append(facts)
            else:
                agent = Agent(
                    client=client, instructions="You are friendly.", context_providers=[facts]
                )
            expected: dict[str, dict[str, Any]] = {}
            turn_s: list[float] = []
            for name, text, stated in script:
                food.CURRENT_USER.set(f"{name}-{run_id}")
                started = time.perf_counter()
                await agent.run(text, session=agent.create_session())
                turn_s.append(time.perf_counter() - started)
                if mode == "queued":
                    await facts.process_now()
                expected.setdefault(name, {}).update(stated)
            if mode == "queued-batch":
                await facts.flush(timeout=120)
            stored = {
                name: await store.get_facts(
                    facts.namespace, MemoryScope(user_id=f"{name}-{run_id}")
                )
                for name in expected
            }
    finally:
        server.shutdown()
    missed = [
        f"{name}.{k}={v!r} (stored {stored[name].get(k)!r})"
        for name, want in expected.items()
        for k, v in want.items()
        if stored[name].get(k) != v
    ]
    return answers.extraction_calls, answers.agent_calls, missed, turn_s


async def amain(args: argparse.Namespace) -> dict[str, Any]:
    server = Server()
    out: dict[str, Any] = {}
    try:
        with server.scratch("facts") as url:
            for scenario in SCRIPTS:
                policies = ("always",) if scenario == "moves" else EXTRACT_WHEN
                for policy in policies:
                    for mode in MODES:
                        calls, agent_calls, missed, turn_s = await run(
                            url, scenario, policy, mode, args.model_ms / 1000
                        )
                        out[f"{scenario}/{policy}/{mode}"] = {
                            "turns": len(SCRIPTS[scenario]),
                            "extraction_calls": calls,
                            "agent_calls": agent_calls,
                            "missed": missed,
                            "turn_ms_p50": round(statistics.median(turn_s) * 1000, 2),
                            "turn_ms_max": round(max(turn_s) * 1000, 2),
                        }
    finally:
        server.close()
    print(f"\nextraction calls take {args.model_ms:g} ms each\n"
          f"{'scenario / extract_when / extraction':<38} {'turns':>5} {'calls':>5} "
          f"{'agent':>5} {'turn p50 ms':>11} {'max':>7}  missed facts")  # fmt: skip
    for name, row in out.items():
        print(
            f"{name:<38} {row['turns']:>5} {row['extraction_calls']:>5} {row['agent_calls']:>5}"
            f" {row['turn_ms_p50']:>11.1f} {row['turn_ms_max']:>7.1f}"
            f"  {', '.join(row['missed']) or '-'}"
        )
    for scenario in SCRIPTS:
        for policy in ("always",) if scenario == "moves" else EXTRACT_WHEN:
            key = f"{scenario}/{policy}"
            before, after = out[f"{key}/turn"], out[f"{key}/queued"]
            print(
                f"{key}: turn p50 {before['turn_ms_p50']:.1f} -> {after['turn_ms_p50']:.1f} ms "
                f"queued ({before['turn_ms_p50'] / after['turn_ms_p50']:.2f}x)"
            )
    return out


#: Where extraction runs: in the turn, queued and processed after each turn, or queued and
#: processed once after the whole conversation.
MODES = ("turn", "queued", "queued-batch")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument(
        "--model-ms", type=float, default=300.0, help="each extraction call's time (ms)"
    )
    args = parser.parse_args()
    out = asyncio.run(amain(args))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
