"""Ids as a person reads them: one rendering for every face that shows an id to an operator
(the command line's tables and lines, the audit page).

An id is a key (:mod:`pgmemory.text.clean`): any non-blank string without NUL or a lone
surrogate is stored exactly as given, so ``"alice"``, ``"alice "`` and ``"ali\\u200bce"`` are
three different users, and two of them look like the first one when printed as they are.
:func:`visible_id` shows what an id holds:

* every code point Python does not call printable (:meth:`str.isprintable`: Unicode's *Other*
  categories Cc, Cf, Cs, Co, Cn and its *Separator* categories Zs, Zl, Zp), except the ASCII
  space U+0020, is written as ``\\uXXXX`` (``\\UXXXXXXXX`` beyond U+FFFF), e.g. a zero-width
  space as ``\\u200b``, a no-break space as ``\\u00a0``, a tab as ``\\u0009``;
* a U+0020 space at the start or the end of the id is written as ``\\u0020`` (inside an id it is
  shown as is);
* a backslash is written as ``\\\\``, so a backslash in the output always starts an escape and two
  different ids never render the same (the rendering can be read back);
* everything else is kept: letters of any script (``José``, ``中文用户``), marks, digits,
  punctuation, symbols and emoji.

What machines read (``--json``, links, form values) carries the exact id, never this rendering.
"""

from __future__ import annotations

#: The ASCII space: shown as is inside an id, escaped at either end.
_SPACE = " "


def visible_id(value: str) -> str:
    """``value`` with its invisible and control code points, its leading and trailing spaces and
    its backslashes escaped (see the module's rules).

    Args:
        value: an id (user, session, agent, application or message id, collection name, actor).

    Returns:
        The text to show a person; ``value`` itself when nothing needed escaping.
    """
    if value.isprintable() and "\\" not in value and value.strip(_SPACE) == value:
        return value
    core = value.strip(_SPACE)
    lead = len(value) - len(value.lstrip(_SPACE))
    trail = len(value) - lead - len(core)
    space = _escape(ord(_SPACE))
    return space * lead + "".join(_shown(ch) for ch in core) + space * trail


def _shown(ch: str) -> str:
    """One code point of an id's inside, as :func:`visible_id` shows it."""
    if ch == "\\":
        return "\\\\"
    return ch if ch.isprintable() else _escape(ord(ch))


def _escape(code: int) -> str:
    """``\\uXXXX`` for a code point of the Basic Multilingual Plane, ``\\UXXXXXXXX`` beyond."""
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


__all__ = ["visible_id"]
