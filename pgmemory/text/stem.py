"""The English (Porter2) stemmer, so that inflected forms share one keyword term.

"ordered" and "orders" become "order", "pizzas" "pizza", "allergies" "allergi" (as does
"allergy"). This is the published Porter2 algorithm (https://snowballstem.org/algorithms/english/
stemmer.html), the one PostgreSQL's ``english_stem`` dictionary implements, written out in plain
Python without a dependency. Terms stored in the database are stems: changing this algorithm
changes the terms of new rows only, so it must stay stable (existing rows would need their terms
recomputed).

Only lower-case ASCII words are stemmed (the tokenizer already lower-cases); any other word
(accented, other scripts, digits) is returned as it is.
"""

from __future__ import annotations

import re
from functools import lru_cache

_VOWELS = frozenset("aeiouy")
_DOUBLES = ("bb", "dd", "ff", "gg", "mm", "nn", "pp", "rr", "tt")
_LI_ENDING = frozenset("cdeghkmnrt")
_ASCII_WORD = re.compile(r"[a-z]+")

_EXCEPTIONS = {
    "skis": "ski", "skies": "sky", "idly": "idl", "gently": "gentl", "ugly": "ugli", "early": "earli", "only": "onli",
    "singly": "singl", "sky": "sky", "news": "news", "howe": "howe", "atlas": "atlas",
    "cosmos": "cosmos", "bias": "bias", "andes": "andes",
}  # fmt: skip
#: Stems left whole by step 1b ("inning", "evening", "proceed" are not inflections).
_ING_KEEP = frozenset("even cann inn earr herr out".split())
_EED_KEEP = frozenset("succ proc exc".split())
_R1_PREFIXES = ("arsen", "commun", "emerg", "gener", "inter", "later", "organ", "past", "univers")

_STEP2 = (
    ("ization", "ize"), ("ational", "ate"), ("fulness", "ful"), ("ousness", "ous"),
    ("iveness", "ive"), ("tional", "tion"), ("biliti", "ble"), ("lessli", "less"),
    ("entli", "ent"), ("ation", "ate"), ("alism", "al"), ("aliti", "al"), ("ousli", "ous"),
    ("iviti", "ive"), ("fulli", "ful"), ("enci", "ence"), ("anci", "ance"), ("abli", "able"),
    ("ogist", "og"), ("izer", "ize"), ("ator", "ate"), ("alli", "al"), ("bli", "ble"),
    ("ogi", "og"), ("li", ""),
)  # fmt: skip
_STEP3 = (
    ("ational", "ate"), ("tional", "tion"), ("alize", "al"), ("icate", "ic"), ("iciti", "ic"),
    ("ative", ""), ("ical", "ic"), ("ness", ""), ("ful", ""),
)  # fmt: skip
_STEP4 = (
    "ement", "ance", "ence", "able", "ible", "ment", "ant", "ent", "ism", "ate", "iti", "ous",
    "ive", "ize", "ion", "al", "er", "ic",
)  # fmt: skip


def _is_vowel(word: str, i: int) -> bool:
    return word[i] in _VOWELS


def _regions(word: str) -> tuple[int, int]:
    """R1 and R2 start offsets (len(word) when empty)."""

    def after_vc(start: int) -> int:
        for i in range(start + 1, len(word)):
            if not _is_vowel(word, i) and _is_vowel(word, i - 1):
                return i + 1
        return len(word)

    r1 = next((len(p) for p in _R1_PREFIXES if word.startswith(p)), None)
    if r1 is None:
        r1 = after_vc(0)
    r2 = after_vc(r1) if r1 < len(word) else len(word)
    return r1, r2


def _short_syllable_end(word: str) -> bool:
    """Whether the word ends in a short syllable."""
    n = len(word)
    if word.endswith("past"):
        return True
    if n >= 3:
        return (
            not _is_vowel(word, n - 3)
            and _is_vowel(word, n - 2)
            and not _is_vowel(word, n - 1)
            and word[-1] not in "wxY"
        )
    return n == 2 and _is_vowel(word, 0) and not _is_vowel(word, 1)


def _has_vowel(part: str) -> bool:
    return any(c in _VOWELS for c in part)


def _porter2(word: str) -> str:
    if len(word) <= 2:
        return word
    if word in _EXCEPTIONS:
        return _EXCEPTIONS[word]
    # y at the start or after a vowel is a consonant: mark it Y
    chars = list(word)
    if chars[0] == "y":
        chars[0] = "Y"
    for i in range(1, len(chars)):
        if chars[i] == "y" and chars[i - 1] in _VOWELS:
            chars[i] = "Y"
    w = "".join(chars)
    r1, r2 = _regions(w)

    # Step 1a
    if w.endswith("sses"):
        w = w[:-2]
    elif w.endswith(("ied", "ies")):
        w = w[:-2] if len(w) > 4 else w[:-1]
    elif w.endswith(("us", "ss")):
        pass
    elif w.endswith("s") and _has_vowel(w[:-2]):
        w = w[:-1]

    # Step 1b
    for suffix in ("eedly", "eed"):
        if w.endswith(suffix):
            stem = w[: -len(suffix)]
            if len(stem) >= r1 and stem not in _EED_KEEP:
                w = stem + "ee"
            break
    else:
        for suffix in ("ingly", "edly", "ing", "ed"):
            if not w.endswith(suffix):
                continue
            stem = w[: -len(suffix)]
            if suffix == "ing" and len(stem) == 2 and stem[1] == "y" and stem[0] not in _VOWELS:
                w = stem[0] + "ie"  # dying, lying, tying, vying
            elif suffix == "ing" and stem in _ING_KEEP:
                pass
            elif _has_vowel(stem):
                w = stem
                if w.endswith(("at", "bl", "iz")):
                    w += "e"
                elif w.endswith(_DOUBLES):
                    if not (len(w) == 3 and w[0] in "aeo"):  # add, egg, err, off stay whole
                        w = w[:-1]
                elif r1 == len(w) and _short_syllable_end(w):
                    w += "e"
            break

    # Step 1c
    if len(w) > 2 and w[-1] in "yY" and not _is_vowel(w, len(w) - 2):
        w = w[:-1] + "i"

    # Step 2
    for suffix, repl in _STEP2:
        if w.endswith(suffix):
            if len(w) - len(suffix) >= r1:
                if suffix == "ogi":
                    if w[-4:-3] == "l":
                        w = w[:-3] + repl
                elif suffix == "li":
                    if w[-3:-2] and w[-3] in _LI_ENDING:
                        w = w[:-2]
                else:
                    w = w[: -len(suffix)] + repl
            break

    # Step 3
    for suffix, repl in _STEP3:
        if w.endswith(suffix):
            if len(w) - len(suffix) >= r1:
                if suffix == "ative":
                    if len(w) - len(suffix) >= r2:
                        w = w[:-5]
                else:
                    w = w[: -len(suffix)] + repl
            break

    # Step 4
    for suffix in _STEP4:
        if w.endswith(suffix):
            if len(w) - len(suffix) >= r2:
                if suffix == "ion":
                    if w[-4:-3] in ("s", "t"):
                        w = w[:-3]
                else:
                    w = w[: -len(suffix)]
            break

    # Step 5
    if w.endswith("e"):
        if len(w) - 1 >= r2 or (len(w) - 1 >= r1 and not _short_syllable_end(w[:-1])):
            w = w[:-1]
    elif w.endswith("l"):
        if len(w) - 1 >= r2 and w.endswith("ll"):
            w = w[:-1]

    return w.replace("Y", "y")


@lru_cache(maxsize=65536)
def stem(word: str) -> str:
    """The Porter2 stem of a lower-case English word; other words unchanged."""
    if not _ASCII_WORD.fullmatch(word):
        return word
    return _porter2(word)


__all__ = ["stem"]
