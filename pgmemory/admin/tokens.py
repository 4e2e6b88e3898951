"""Operators' access tokens: issued once, kept hashed, revocable, with an expiry.

One design for every face that lets a person in (the audit page today, the MCP server next):

* a token is ``pgm_`` and 43 URL-safe characters (32 random bytes), shown once when issued;
* the database keeps only its sha256 (the token has 256 random bits, so a fast hash is safe),
  with a label (``name``), a purpose (what it opens), the expiry and the revocation time;
* a token is valid while it is neither revoked nor expired, by the server's clock; checks run
  on the primary (never a replica), so a revocation takes effect at once.

Only the owner reads or writes the table: the least-privilege role has no grant on it.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.exc import IntegrityError

from pgmemory.admin import statements as s
from pgmemory.admin.pages import clamp_limit
from pgmemory.errors import InvalidInputError
from pgmemory.store._engine.clauses import clause
from pgmemory.store._engine.database import Database
from pgmemory.store.validation import check_name

#: What a token can open.
PURPOSES = ("ui", "mcp")
#: Every token starts with this (secret scanners and people can tell what a leaked one is).
TOKEN_PREFIX = "pgm_"
#: How long a token lives unless the issuer says otherwise.
DEFAULT_LIFETIME = timedelta(days=30)
#: The longest lifetime accepted: tokens that never expire are how access outlives its reason.
MAX_LIFETIME = timedelta(days=366)


@dataclass(frozen=True, slots=True)
class TokenInfo:
    """A token as listed: never the token nor its hash.

    Attributes:
        id: its number.
        name: the label it was issued under (whose or what it is).
        purpose: what it opens (one of :data:`PURPOSES`).
        created_at: when it was issued.
        expires_at: when it stops working.
        revoked_at: when it was revoked, or None.
    """

    id: int
    name: str
    purpose: str
    created_at: datetime
    expires_at: datetime
    revoked_at: datetime | None

    def as_dict(self) -> dict[str, Any]:
        """JSON-native form (for ``--json``)."""
        return {
            "id": self.id,
            "name": self.name,
            "purpose": self.purpose,
            "created_at": self.created_at.isoformat(),
            "expires_at": self.expires_at.isoformat(),
            "revoked_at": None if self.revoked_at is None else self.revoked_at.isoformat(),
        }


@dataclass(frozen=True, slots=True)
class IssuedToken:
    """A token just issued: the only time the token itself is known.

    Attributes:
        token: the secret to hand to the person or program (shown once, never stored).
        info: what was recorded about it.
    """

    token: str
    info: TokenInfo

    def __repr__(self) -> str:  # the secret stays out of logs and tracebacks
        return f"IssuedToken(token='{TOKEN_PREFIX}…', info={self.info!r})"


def token_sha256(token: str) -> str:
    """The hex sha256 under which ``token`` is kept."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def _check_purpose(purpose: str) -> str:
    if purpose not in PURPOSES:
        raise InvalidInputError(f"purpose is {purpose!r}; expected one of {PURPOSES}")
    return purpose


def _info(row: Any) -> TokenInfo:
    return TokenInfo(
        id=row["id"],
        name=row["name"],
        purpose=row["purpose"],
        created_at=row["created_at"],
        expires_at=row["expires_at"],
        revoked_at=row["revoked_at"],
    )


async def issue_token(
    db: Database, name: str, *, purpose: str = "ui", lifetime: timedelta = DEFAULT_LIFETIME
) -> IssuedToken:
    """Issue a new token under ``name`` (e.g. the operator's or the program's name).

    Args:
        db: the store's database.
        name: the label, unique among live tokens (an expired one of that name is revoked).
        purpose: what it opens (one of :data:`PURPOSES`).
        lifetime: how long it works (more than 0, at most :data:`MAX_LIFETIME`).

    Returns:
        The token (shown only here) and its record.

    Raises:
        InvalidInputError: a bad name, purpose or lifetime, or a live token already has
            that name (revoke it first, or pick another name).
    """
    check_name(name, what="token name")
    _check_purpose(purpose)
    if not isinstance(lifetime, timedelta) or not timedelta(0) < lifetime <= MAX_LIFETIME:
        raise InvalidInputError(
            f"lifetime is {lifetime!r}; expected more than 0 and at most {MAX_LIFETIME.days} "
            "days: tokens that never expire outlive the reason they were issued"
        )
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    params = {
        "name": name,
        "purpose": purpose,
        "token_sha256": token_sha256(token),
        "lifetime": f"{lifetime.total_seconds()} seconds",
    }
    try:
        async with db.write(users=()) as conn:
            row = (await conn.execute(clause(s.ISSUE_TOKEN), params)).mappings().one()
    except IntegrityError as exc:
        if "uq_pgmemory_access_tokens_name" not in str(exc.orig):
            raise
        raise InvalidInputError(
            f"a live token is already named {name!r}: revoke it first "
            f"(`pgmemory token revoke {name}`) or issue this one under another name"
        ) from None
    return IssuedToken(token=token, info=_info(row))


async def verify_token(db: Database, token: str, *, purpose: str) -> TokenInfo | None:
    """The token's record when ``token`` is live and opens ``purpose``, else None.

    Args:
        db: the store's database.
        token: what was presented (anything: a wrong value is simply not found).
        purpose: what it must open.
    """
    _check_purpose(purpose)
    if not token.startswith(TOKEN_PREFIX):
        return None
    params = {"token_sha256": token_sha256(token), "purpose": purpose}
    async with db.write(users=()) as conn:  # the primary: a revocation counts at once
        row = (await conn.execute(clause(s.VALID_TOKEN), params)).mappings().first()
    return None if row is None else _info(row)


async def token_still_valid(db: Database, token_id: int, *, purpose: str) -> bool:
    """Whether the token numbered ``token_id`` is still live for ``purpose``."""
    _check_purpose(purpose)
    async with db.write(users=()) as conn:
        result = await conn.execute(
            clause(s.TOKEN_STILL_VALID), {"id": token_id, "purpose": purpose}
        )
        return bool(result.scalar_one())


async def list_tokens(
    db: Database, *, include_inactive: bool = False, limit: int | None = None
) -> list[TokenInfo]:
    """Tokens, newest first (live ones only unless ``include_inactive``)."""
    params = {"include_inactive": include_inactive, "limit": clamp_limit(limit)}
    async with db.write(users=()) as conn:
        rows = (await conn.execute(clause(s.LIST_TOKENS), params)).mappings().all()
    return [_info(row) for row in rows]


async def revoke_token(db: Database, name_or_id: str | int) -> TokenInfo | None:
    """Revoke the live token with this name (or number); None when there is none.

    A signed-in audit page re-checks its token on every request, so it is locked out at once.
    """
    if isinstance(name_or_id, bool) or not isinstance(name_or_id, (str, int)):
        raise InvalidInputError(f"revoke a token by name or number, got {name_or_id!r}")
    if isinstance(name_or_id, int):
        params: dict[str, Any] = {"name": None, "id": name_or_id}
    else:
        params = {"name": check_name(name_or_id, what="token name"), "id": None}
    async with db.write(users=()) as conn:
        row = (await conn.execute(clause(s.REVOKE_TOKEN), params)).mappings().first()
    return None if row is None else _info(row)


__all__ = [
    "DEFAULT_LIFETIME",
    "MAX_LIFETIME",
    "PURPOSES",
    "TOKEN_PREFIX",
    "IssuedToken",
    "TokenInfo",
    "issue_token",
    "list_tokens",
    "revoke_token",
    "token_sha256",
    "token_still_valid",
    "verify_token",
]
