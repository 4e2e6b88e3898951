"""Ids as operators read them (pgmemory.text.visible): what is invisible is shown escaped, and
two different ids never look the same."""

from __future__ import annotations

import random
import re
import sys
import unicodedata

import pytest

from pgmemory.text.visible import visible_id


def read_back(shown: str) -> str:
    """The id a rendering came from (what an operator can do with the text on screen)."""

    def one(match: re.Match[str]) -> str:
        escape = match.group(0)
        return "\\" if escape == "\\\\" else chr(int(escape[2:], 16))

    assert re.fullmatch(r"(?:[^\\]|\\\\|\\u[0-9a-f]{4}|\\U[0-9a-f]{8})*", shown), shown
    return re.sub(r"\\\\|\\u[0-9a-f]{4}|\\U[0-9a-f]{8}", one, shown)


@pytest.mark.parametrize(
    "value",
    ["alice", "user-42", "a b", "José", "Zoë Müller", "中文用户", "ユーザー", "사용자", "Ελένη",
     "😀 emoji", "o'brien", 'say "hi"', "a/b", "100%", "x?y=1&z#w", "e\u0301", "👍\ufe0f"],
)  # fmt: skip
def test_ordinary_ids_are_shown_as_they_are(value: str) -> None:
    assert visible_id(value) is value


@pytest.mark.parametrize(
    ("value", "shown", "category"),
    [
        ("a\x00b", "a\\u0000b", "Cc"),
        ("a\tb", "a\\u0009b", "Cc"),
        ("a\nb", "a\\u000ab", "Cc"),
        ("a\x1bb", "a\\u001bb", "Cc"),
        ("a\x7fb", "a\\u007fb", "Cc"),
        ("a\x85b", "a\\u0085b", "Cc"),
        ("ali\u200bce", "ali\\u200bce", "Cf"),  # zero-width space
        ("ali\u200dce", "ali\\u200dce", "Cf"),  # zero-width joiner
        ("\u202ealice", "\\u202ealice", "Cf"),  # right-to-left override
        ("alice\ufeff", "alice\\ufeff", "Cf"),  # byte order mark
        ("a\u00adb", "a\\u00adb", "Cf"),  # soft hyphen
        ("a\u00a0b", "a\\u00a0b", "Zs"),  # no-break space
        ("a\u2003b", "a\\u2003b", "Zs"),  # em space
        ("a\u3000b", "a\\u3000b", "Zs"),  # ideographic space
        ("a\u2028b", "a\\u2028b", "Zl"),
        ("a\u2029b", "a\\u2029b", "Zp"),
        ("a\ue000b", "a\\ue000b", "Co"),
    ],
)
def test_each_invisible_or_control_code_point_is_escaped(
    value: str, shown: str, category: str
) -> None:
    [odd] = [ch for ch in value if not ch.isalpha()]
    assert unicodedata.category(odd) == category
    assert visible_id(value) == shown
    assert read_back(shown) == value


def test_astral_code_points_take_eight_hex_digits() -> None:
    tag = "\U000e0041"  # TAG LATIN CAPITAL LETTER A, Cf
    assert unicodedata.category(tag) == "Cf"
    assert visible_id(f"bob{tag}") == "bob\\U000e0041"
    assert visible_id("\U0010fffd") == "\\U0010fffd"  # a private use code point, Co
    assert visible_id("😀") == "😀"  # an astral symbol: visible, kept


def test_spaces_at_either_end_are_escaped_and_inside_kept() -> None:
    assert visible_id("alice ") == "alice\\u0020"
    assert visible_id(" alice") == "\\u0020alice"
    assert visible_id("  a  b  ") == "\\u0020\\u0020a  b\\u0020\\u0020"
    assert visible_id("   ") == "\\u0020\\u0020\\u0020"
    assert visible_id(" \u200b ") == "\\u0020\\u200b\\u0020"
    assert visible_id("\u00a0alice") == "\\u00a0alice"  # another space: escaped anywhere


def test_a_backslash_is_doubled_so_an_escape_is_never_taken_for_an_id() -> None:
    assert visible_id("a\\b") == "a\\\\b"
    # The id that IS the six characters of an escape, and the id holding the character:
    assert visible_id("ali\\u200bce") == "ali\\\\u200bce"
    assert visible_id("ali\u200bce") == "ali\\u200bce"
    assert visible_id("x\\u0020") == "x\\\\u0020"
    assert visible_id("x ") == "x\\u0020"
    assert visible_id("\\") == "\\\\"


def test_different_ids_never_render_the_same() -> None:
    """Random ids over letters, spaces, backslashes, escape look-alikes and invisible code
    points: every rendering reads back to its own id, so no two collide."""
    alphabet = ["a", "u", "0", "2", "b", " ", "\\", "\u200b", "\u00a0", "\t", "\U000e0041",
                "é", "中", "😀"]  # fmt: skip
    chosen = random.Random(59)
    ids = {"".join(chosen.choices(alphabet, k=chosen.randint(1, 8))) for _ in range(20_000)}
    shown = {visible_id(value): value for value in ids}
    assert len(shown) == len(ids)
    assert all(read_back(text) == value for text, value in shown.items())


def test_every_code_point_is_either_printable_or_escaped() -> None:
    """What the rendering leaves is printable (nothing of Cc, Cf, Zs but U+0020 on screen)."""
    invisible = {"Cc", "Cf", "Cs", "Co", "Cn", "Zs", "Zl", "Zp"}
    for code in range(sys.maxunicode + 1):
        ch = chr(code)
        shown = visible_id(f"a{ch}a")
        if unicodedata.category(ch) in invisible and ch != " ":
            escape = f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"
            assert shown == f"a{escape}a", hex(code)
        elif ch == "\\":
            assert shown == "a\\\\a"
        else:
            assert shown == f"a{ch}a", hex(code)
