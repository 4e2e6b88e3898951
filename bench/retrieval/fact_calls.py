"""How many model calls does fact extraction make, per ``extract_when`` policy, and which facts
does each policy miss?

    .venv/bin/python bench/retrieval/fact_calls.py            # ~20 s

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
called; a fact is missed when its message was never sent. Prints a table of model calls
(extraction calls, and the agent's own calls for scale) and missed facts.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import sys
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


class Extractor:
    """The stand-in model's answers: extraction requests (a ``response_format``) are counted
    and answered from the script's table; every other request gets ``inner(body)``."""

    def __init__(self, inner: Any, table: dict[str, dict[str, Any]]) -> None:
        self.inner = inner
        self.table = table
        self.extraction_calls = 0
        self.agent_calls = 0

    def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        if not body.get("response_format"):
            self.agent_calls += 1
            return self.inner(body)
        self.extraction_calls += 1
        facts: dict[str, Any] = {}
        for m in body["messages"]:
            if m["role"] == "user":
                facts.update(self.table.get(str(m.get("content") or ""), {}))
        return {"text": json.dumps(facts)}


def small(body: dict[str, Any]) -> dict[str, Any]:
    """The agent's model in the chat scenario: a short reply."""
    return {"text": "Sure."}


async def run(
    url: str, scenario: str, policy: str
) -> tuple[int, int, list[str], dict[str, dict[str, Any]]]:
    script = FOOD if scenario == "food" else CHAT
    model: type[BaseModel] = DinerFacts if scenario == "food" else UserInfo
    answers = Extractor(
        food.step_for if scenario == "food" else small, {t: f for _, t, f in script}
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
            )
            if scenario == "food":
                agent = food.build_agent(client, store, user_id=user)
                agent.context_providers.append(facts)
            else:
                agent = Agent(
                    client=client, instructions="You are friendly.", context_providers=[facts]
                )
            expected: dict[str, dict[str, Any]] = {}
            for name, text, stated in script:
                food.CURRENT_USER.set(f"{name}-{run_id}")
                await agent.run(text, session=agent.create_session())
                expected.setdefault(name, {}).update(stated)
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
    return answers.extraction_calls, answers.agent_calls, missed, stored


async def amain(args: argparse.Namespace) -> dict[str, Any]:
    server = Server()
    out: dict[str, Any] = {}
    try:
        with server.scratch("facts") as url:
            for scenario in ("food", "chat"):
                turns = len(FOOD if scenario == "food" else CHAT)
                for policy in EXTRACT_WHEN:
                    calls, agent_calls, missed, _ = await run(url, scenario, policy)
                    out[f"{scenario}/{policy}"] = {
                        "turns": turns,
                        "extraction_calls": calls,
                        "agent_calls": agent_calls,
                        "missed": missed,
                    }
    finally:
        server.close()
    print(f"\n{'scenario / extract_when':<24} {'turns':>5} {'extraction calls':>17} "
          f"{'agent calls':>11}  missed facts")  # fmt: skip
    for name, row in out.items():
        print(
            f"{name:<24} {row['turns']:>5} {row['extraction_calls']:>17} {row['agent_calls']:>11}"
            f"  {', '.join(row['missed']) or '-'}"
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    out = asyncio.run(amain(args))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
