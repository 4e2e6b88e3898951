"""The local token estimate against known tokenizer counts, for English and CJK."""

from __future__ import annotations

import pytest

from pgmemory.text.tokens import estimate_tokens

#: cl100k_base (GPT-4) counts, from OpenAI's "How to count tokens with tiktoken" cookbook
#: and the tokenizer page.
KNOWN = [
    ("tiktoken is great!", 6),
    ("antidisestablishmentarianism", 6),
    ("お誕生日おめでとう", 9),
    ("The quick brown fox jumps over the lazy dog.", 10),
]


@pytest.mark.parametrize(("text", "tokens"), KNOWN)
def test_close_to_known_counts(text: str, tokens: int) -> None:
    assert 0.75 * tokens <= estimate_tokens(text) <= 1.3 * tokens


def test_cjk_is_one_token_a_character_not_a_quarter() -> None:
    chinese = "帮我点一份外卖，一荤一素，我不能吃辣。" * 100
    assert estimate_tokens(chinese) == len(chinese)
    # chars / 4 would claim a quarter of that and overflow any budget built on it.
    assert estimate_tokens(chinese) > 3 * (len(chinese) // 4)


def test_english_is_about_four_characters_a_token() -> None:
    prose = "I ordered two pizzas and a salad for dinner, the same as last week. " * 50
    assert len(prose) / 5 <= estimate_tokens(prose) <= len(prose) / 3


def test_mixed_text_adds_up_and_symbols_are_not_undercounted() -> None:
    assert estimate_tokens("") == 0
    assert estimate_tokens("我不能吃辣 but I like fish") == 5 + 4  # five characters, four words
    # JSON and numbers: one piece per punctuation mark and per group of up to 3 digits.
    assert estimate_tokens('{"a": [1, 2, 3]}') >= 12
    assert estimate_tokens("1234567") == 3
    # Other scripts are denser than English.
    assert estimate_tokens("Привет, как дела?") >= 8


def test_lines_bound_the_joined_text() -> None:
    """What the recall budget relies on: joined by newlines, lines cost at most the sum of
    their estimates plus one per newline."""
    import random

    rng = random.Random(3)
    alphabet = 'ab Z9_.,"\\{}[]…我不能吃辣お誕ЖéŁ😀\t'
    for _ in range(500):
        lines = [
            "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
            for _ in range(rng.randint(1, 6))
        ]
        joined = estimate_tokens("\n".join(lines))
        assert joined <= sum(estimate_tokens(line) + 1 for line in lines), lines
