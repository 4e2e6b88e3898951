"""What user text becomes before PostgreSQL sees it: one normalisation for every caller.

The store applies these rules to memory contents, search queries, metadata, facts and chat
history; memory providers may call the same functions (e.g. to trim a recall query before
logging it) and get the text the store will use.

The rules:

* NUL (U+0000) becomes U+FFFD REPLACEMENT CHARACTER: PostgreSQL ``text`` and ``jsonb`` cannot
  hold NUL, and a visible mark is kept where something was.
* A lone surrogate (U+D800 to U+DFFF without its partner, e.g. half an emoji as ``json.loads``
  returns ``"\\ud83d"``) becomes U+FFFD: it has no UTF-8 form. A high and low surrogate that
  stand next to each other are joined into the character they encode.
* Nothing else changes: the six printable characters ``\\u0000`` (a backslash, ``u`` and four
  zeros), U+2028, U+2029 and every other character are kept as they are.
* A search query is cleaned the same way, then cut to its first ``max_chars`` characters (the
  head of the text, where a question usually is): a query is never refused for its length.
* JSON values (metadata, facts, history messages) have every string, keys included, cleaned;
  they must be JSON-native and nested at most :data:`MAX_JSON_DEPTH` deep, and no two keys of
  one object may become the same JSON key (``1`` and ``"1"``; ``"a\\x00"`` and ``"a\\ufffd"``).

Ids (user, session, message ids, collection names) are keys, not text: they are never
rewritten, and the store refuses an id with NUL or a lone surrogate instead.

Tool calls' arguments and tool results arrive as JSON text that ``json.dumps``' default wrote,
every non-ASCII character as a ``\\uXXXX`` escape (agent-framework serialises a tool's
non-str result so). The memory providers store such text as :func:`readable_json` writes it:
the same JSON value, its characters readable.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from pgmemory.errors import InvalidInputError

#: What NUL and lone surrogates become.
REPLACEMENT = "\ufffd"
#: Deepest nesting of JSON values accepted (an object or list inside another counts one level).
MAX_JSON_DEPTH = 64


def clean_text(text: str) -> str:
    """The text with NUL and lone surrogates replaced by U+FFFD (see the module's rules).

    Args:
        text: Any string.

    Returns:
        A string PostgreSQL can store; the same object when nothing needed replacing.
    """
    if "\x00" in text:
        text = text.replace("\x00", REPLACEMENT)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        # UTF-16 round trip: paired surrogates join into their character, lone ones become U+FFFD.
        text = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return text


def clean_query(text: str, *, max_chars: int) -> str:
    """A search query as the store uses it: cleaned, then cut to its first ``max_chars`` characters.

    Args:
        text: The query.
        max_chars: The longest text kept (the store passes ``Settings.max_text_chars``).

    Returns:
        The cleaned head of the query.
    """
    return clean_text(text)[:max_chars]


def bad_surrogate_index(text: str) -> int:
    """Index of the first lone surrogate in ``text``, or -1 when it has none."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return int(exc.start)
    return -1


def readable_json(text: str) -> str:
    """``text`` with its ``\\uXXXX`` escapes of non-ASCII characters written as the
    characters, when it is JSON exactly as ``json.dumps`` writes it by default
    (``ensure_ascii``); any other text unchanged.

    The value does not change: ``json.loads`` reads the same value from both forms, so text
    stored before in the escaped form decodes as the readable one does. Escapes JSON needs
    (quotes, backslashes, control characters) stay, and so does the escaped text of a value
    that holds a lone surrogate (its readable form would have no UTF-8 form).

    Args:
        text: Any text (a tool result, a tool call's arguments).

    Returns:
        The readable JSON, or ``text`` itself.
    """
    if "\\u" not in text:
        return text
    try:
        value = json.loads(text)
        if json.dumps(value) != text:  # not json.dumps' own escaped form: kept as written
            return text
        readable = json.dumps(value, ensure_ascii=False)
    except (ValueError, RecursionError):  # not JSON, or nested past what json reads
        return text
    return text if bad_surrogate_index(readable) >= 0 else readable


def clean_json(value: Any, *, what: str, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """A JSON-native copy of ``value`` with every string cleaned (see the module's rules).

    Mappings become dicts and tuples become lists. Keys that are not strings are converted as
    :func:`json.dumps` converts them (``1`` -> ``"1"``, ``True`` -> ``"true"``, ``None`` ->
    ``"null"``).

    Args:
        value: A mapping, list, string, number, bool or None, nested at most ``max_depth`` deep.
        what: The caller's name for the value, for error messages (e.g. ``"records[3].metadata"``).
        max_depth: The deepest nesting accepted.

    Returns:
        The cleaned copy.

    Raises:
        InvalidInputError: A value JSON cannot hold (another type, NaN or infinity), nesting
            deeper than ``max_depth``, or two keys of one object that become the same JSON key.
            The message gives positions and types, never the text itself.
    """
    return _clean(value, what=what, depth=0, max_depth=max_depth)


def _clean(value: Any, *, what: str, depth: int, max_depth: int) -> Any:
    if isinstance(value, str):
        return clean_text(value)
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidInputError(
                f"{what} is not JSON-serialisable: it holds a non-finite number ({value}) at "
                f"depth {depth}, and JSON has no NaN or infinity: store None or a string instead"
            )
        return value
    if isinstance(value, (Mapping, list, tuple)):
        if depth >= max_depth:
            raise InvalidInputError(
                f"{what} is nested more than {max_depth} levels deep; flatten it (the limit "
                "keeps every reader of the stored JSON safe from runaway recursion)"
            )
        if isinstance(value, Mapping):
            return _clean_object(value, what=what, depth=depth + 1, max_depth=max_depth)
        return [_clean(item, what=what, depth=depth + 1, max_depth=max_depth) for item in value]
    raise InvalidInputError(
        f"{what} is not JSON-serialisable: it holds a {type(value).__name__} at depth {depth}; "
        "use str, int, float, bool, None, lists and dicts"
    )


def _clean_object(
    value: Mapping[Any, Any], *, what: str, depth: int, max_depth: int
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for position, (key, item) in enumerate(value.items()):
        name = _json_key(key, what=what, depth=depth, position=position)
        if name in out:
            raise InvalidInputError(
                f"{what}: key #{position} of an object at depth {depth} becomes the same JSON "
                "key as an earlier one (e.g. 1 and '1', or a NUL and U+FFFD); keep only one"
            )
        out[name] = _clean(item, what=what, depth=depth, max_depth=max_depth)
    return out


def _json_key(key: object, *, what: str, depth: int, position: int) -> str:
    """An object key as JSON spells it (what json.dumps makes of it), cleaned."""
    if isinstance(key, str):
        return clean_text(key)
    if key is None:
        return "null"
    if isinstance(key, bool):
        return "true" if key else "false"
    if isinstance(key, int):
        return str(int(key))
    if isinstance(key, float) and math.isfinite(key):
        return float.__repr__(key)
    raise InvalidInputError(
        f"{what}: key #{position} of an object at depth {depth} is a {type(key).__name__}; "
        "JSON object keys are strings (int, float, bool and None are converted)"
    )
