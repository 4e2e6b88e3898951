"""Keyword terms for full-text search, for Chinese as well as space-separated languages.

PostgreSQL's ``simple`` configuration splits on spaces and punctuation, so a run of Chinese
characters would be one unsearchable "word". pgmemory therefore computes the terms itself:
lower-cased words for alphabetic scripts (minus a few English stop words), English words
reduced to their Porter2 stem (pgmemory.text.stem: "ordered" and "orders" both give "order",
"peanuts" gives "peanut"), and for Han, kana and Hangul runs every pair of neighbouring
characters (bigrams; a lone character stands for itself), the usual way to index text without
spaces. Terms contain only letters and digits, so they are safe to hand to
``websearch_to_tsquery``.

Stored rows keep the terms computed when they were written: rows written before stemming
(or with ``STEMMING`` off) match a stemmed query only where word and stem coincide, until
their terms are recomputed.
"""

from __future__ import annotations

import re

from pgmemory.text.stem import stem

_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
#: A run of Han/kana/Hangul (group 1) or a run of other letters and digits.
_TOKEN = re.compile(rf"([{_CJK}]+)|[^\W_{_CJK}]+", re.UNICODE)
STOP_WORDS = frozenset(
    [
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "but",
        "by",
        "do",
        "does",
        "did",
        "for",
        "from",
        "has",
        "have",
        "had",
        "he",
        "her",
        "his",
        "how",
        "i",
        "if",
        "in",
        "into",
        "is",
        "it",
        "its",
        "me",
        "my",
        "no",
        "not",
        "of",
        "on",
        "or",
        "our",
        "she",
        "so",
        "that",
        "the",
        "their",
        "them",
        "they",
        "this",
        "to",
        "us",
        "was",
        "we",
        "were",
        "what",
        "when",
        "where",
        "which",
        "who",
        "why",
        "will",
        "with",
        "you",
        "your",
        "yours",
    ]
)
#: Most terms taken from one text; a memory is capped at the store's text limit anyway.
MAX_TERMS = 4096
#: Reduce English words to their stem (documents and queries alike). A switch for measuring.
STEMMING = True


def terms(text: str) -> list[str]:
    """The keyword terms of a text, in order, duplicates kept (they weigh in ranking)."""
    out: list[str] = []
    for match in _TOKEN.finditer(text.lower()):
        token = match.group()
        if match.lastindex == 1:  # CJK (one regex pass tells which kind of run it is)
            if len(token) == 1:
                out.append(token)
            out.extend(token[i : i + 2] for i in range(len(token) - 1))
        elif token not in STOP_WORDS:
            out.append(stem(token) if STEMMING else token)
        if len(out) >= MAX_TERMS:
            break
    return out[:MAX_TERMS]


def document(text: str) -> str:
    """Terms of a stored text, space-separated, for ``to_tsvector('simple', ...)``."""
    return " ".join(terms(text))


def distinct(text: str) -> list[str]:
    """A text's distinct terms, in the order they first appear (a search's ``term_list``)."""
    return list(dict.fromkeys(terms(text)))


def or_query(distinct_terms: list[str]) -> str:
    """An OR query over distinct terms (:func:`distinct`), for ``websearch_to_tsquery('simple',
    ...)``; a term ``or`` would read as the operator, so it is left out."""
    return " or ".join(t for t in distinct_terms if t != "or")


def query(text: str) -> str:
    """An OR query over a text's distinct terms (:func:`or_query` of :func:`distinct`)."""
    return or_query(distinct(text))
