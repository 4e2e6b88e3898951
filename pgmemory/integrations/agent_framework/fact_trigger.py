"""When the fact provider asks the model for facts: a policy, and the cheap local check behind
the ``"likely"`` policy.

The check answers one question for a user message without a model: may it state something
about the user? It looks for a self-statement (English "I", "I'm", "my", "call me", ...;
Chinese 我 as a subject, not the object of a request such as 帮我 / 给我; Japanese 私 / 僕;
Korean 저는 / 제 / 나는 / 내) or for a word of one of the fact fields' names (``home_city``:
"home", "city"). It is deliberately generous: a false alarm costs one model call, a miss loses
a fact until the user states it again. It misses facts stated with no first-person word and
no field word ("Vegetarian here."), which the ``"always"`` policy would catch.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Literal

#: When extraction calls the model: after every run with user text; only while a watched fact
#: (the required ones, or every field when none is required) is unknown; or only when
#: :func:`may_state_fact` says a user message may carry a fact.
ExtractWhen = Literal["always", "until_known", "likely"]
EXTRACT_WHEN: tuple[str, ...] = ("always", "until_known", "likely")

_ENGLISH = re.compile(
    r"\b(?:i|i'm|im|i've|i'd|i'll|my|mine|myself|call\s+me|me\s+too)\b", re.IGNORECASE
)
# 我 as the one who does or is something: not after a verb that makes it an object
# (帮我 "help me", 给我 "give me", 替我, 让我 "let me" ...); 叫我 "call me" is a name.
_CHINESE_OBJECT = re.compile(r"(?:帮|幫|给|給|替|让|讓|请|請|告诉|告訴|陪|和|跟|对|對)我")
_OTHER_CJK = re.compile(r"私は|私の|僕|俺|저는|제가|제\s|나는|내가|내\s")


def _words(name: str) -> list[str]:
    return [w for w in re.split(r"[_\W]+", name.lower()) if len(w) >= 3]


def field_words(names: Iterable[str]) -> frozenset[str]:
    """The words of the fact fields' names (``home_city`` -> home, city), three letters or more."""
    return frozenset(w for name in names for w in _words(name))


def may_state_fact(text: str, words: frozenset[str] = frozenset()) -> bool:
    """Whether ``text`` may state a fact about its author: a self-statement, or one of
    ``words`` (see :func:`field_words`) as a whole word. Local and cheap (a few regular
    expressions); generous by design."""
    if _ENGLISH.search(text) or _OTHER_CJK.search(text):
        return True
    if "我" in text and ("叫我" in text or "我" in _CHINESE_OBJECT.sub("", text)):
        return True
    if words:
        lowered = text.lower()
        return any(w in words for w in re.findall(r"[^\W_]+", lowered))
    return False


__all__ = ["EXTRACT_WHEN", "ExtractWhen", "field_words", "may_state_fact"]
