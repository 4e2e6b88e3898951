"""English stemming, so that inflected forms share one keyword term.

"ordered" and "orders" become "order", "pizzas" "pizza", "allergies" "allergi" (as does
"allergy"). The stemmer is Snowball's English (Porter2) algorithm from the ``snowballstemmer``
package, the algorithm PostgreSQL's ``english_stem`` dictionary implements. Terms stored in the
database are stems, so the algorithm must stay stable: rows keep the terms computed when they
were written (migration 0005 recomputed the rows written before stemming).

Only lower-case ASCII words are stemmed (the tokenizer already lower-cases); any other word
(accented, other scripts, digits) is returned as it is.
"""

from __future__ import annotations

import re
import threading
from functools import lru_cache

import snowballstemmer

_ASCII_WORD = re.compile(r"[a-z]+")
#: A Snowball stemmer keeps its working state on the object: one per thread.
_local = threading.local()


def _english() -> snowballstemmer.stemmer:
    stemmer = getattr(_local, "stemmer", None)
    if stemmer is None:
        stemmer = _local.stemmer = snowballstemmer.stemmer("english")
    return stemmer


@lru_cache(maxsize=1 << 16)
def stem(word: str) -> str:
    """The English stem of a lower-case ASCII word; any other word unchanged.

    Args:
        word: one token, already lower-cased.

    Returns:
        Its stem (cached: chat text repeats its words).
    """
    if not _ASCII_WORD.fullmatch(word):
        return word
    result: str = _english().stemWord(word)
    return result
