"""A least-privilege application role: what the library needs to run, and nothing more.

The role may connect, use the schema, read and write the data tables (collections, memories,
chat history, facts), and only INSERT and SELECT the audit tables; it may not create objects
(no DDL) nor read the per-user secrets. Erasure and retention change audit rows only through
``pgmemory_erase_user_audit`` and ``pgmemory_prune_audit`` (SECURITY DEFINER functions owned by
the role that ran the migrations), which it may execute. Migrations, ``enable_ann`` (index DDL)
and ``pgmemory audit verify``'s guard probe need the owner.

The password never appears in a statement: libpq turns it into a SCRAM-SHA-256 verifier on
this machine (``PQencryptPasswordConn``, as ``psql``'s ``\\password`` does) and only that is sent.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Any

from pgmemory.admin import statements as s
from pgmemory.errors import InvalidInputError
from pgmemory.store import queries as q
from pgmemory.store._engine.clauses import clause
from pgmemory.store._engine.database import Database

logger = logging.getLogger(__name__)

_ROLE_NAME = re.compile(s.ROLE_NAME_PATTERN)
_VERIFIER = re.compile(s.PASSWORD_VERIFIER_PATTERN)


@dataclass(frozen=True)
class RoleReport:
    """What :func:`create_app_role` did.

    Attributes:
        role: the role's name.
        created: True when the role was created, False when an existing one was reset.
        database: the database it may connect to.
        schema: the schema it works in.
        statements: the statements run, with the password verifier masked.
        warnings: what weakens the arrangement and is outside this command (e.g. PUBLIC may
            create objects in the schema).
    """

    role: str
    created: bool
    database: str
    schema: str
    statements: list[str]
    warnings: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """The report for ``--json``."""
        return {
            "role": self.role,
            "created": self.created,
            "database": self.database,
            "schema": self.schema,
            "statements": self.statements,
            "warnings": self.warnings,
        }


def check_role_name(name: object) -> str:
    """Check a role name for :func:`create_app_role`.

    Raises:
        InvalidInputError: Not 1-63 of ``a-z``, ``0-9``, ``_`` starting with a letter or ``_``,
            or a reserved ``pg_`` name.
    """
    if not isinstance(name, str) or not _ROLE_NAME.fullmatch(name) or name.startswith("pg_"):
        raise InvalidInputError(
            "role name must be 1-63 characters of a-z, 0-9 and _, starting with a letter or _, "
            "and not start with pg_ (e.g. pgmemory_app)"
        )
    return name


def _check_password(password: object) -> str:
    if not isinstance(password, str) or not password:
        raise InvalidInputError("password is empty; pass the application role's password")
    if len(password) < 12:
        raise InvalidInputError("password is shorter than 12 characters; use a longer one")
    if "\x00" in password:
        raise InvalidInputError("password contains NUL; remove it")
    return password


async def create_app_role(db: Database, name: str, password: str) -> RoleReport:
    """Create (or reset) the application role ``name`` with ``password``, in one transaction.

    Run it as the role that ran the migrations (it owns the tables and grants on them). Running
    it again resets the role's attributes, password and grants (taking back any privilege on the
    audits beyond INSERT and SELECT).

    Args:
        db: the open database, connected as the schema's owner.
        name: the role's name (checked by :func:`check_role_name`).
        password: its password (12 characters at least); never logged nor sent as text.

    Returns:
        What was done.

    Raises:
        InvalidInputError: A bad name or password, or ``name`` is an existing role with powers
            beyond logging in (superuser, CREATEROLE, ...): choose another name.
    """
    check_role_name(name)
    _check_password(password)
    async with db.write() as conn:
        powerful = (await conn.execute(clause(s.ROLE_ATTRIBUTES), {"name": name})).scalar()
        if powerful:
            raise InvalidInputError(
                f"role {name} exists with powers an application role must not have "
                "(superuser, CREATEROLE, CREATEDB, BYPASSRLS or REPLICATION); choose another name"
            )
        created = powerful is None
        # the grants reach the catalogue (a reference table on Citus) after the shards
        await conn.execute(clause(q.SEQUENTIAL_SHARD_WRITES))
        context = (await conn.execute(clause(s.ROLE_CONTEXT))).mappings().one()
        quote = conn.dialect.identifier_preparer.quote_identifier
        names = {
            "role": quote(name),
            "database": quote(context["database"]),
            "schema": quote(context["schema"]),
        }
        # DDL goes to psycopg as it is, without parameters: nothing in it is a placeholder.
        raw = await conn.get_raw_connection()
        driver = raw.driver_connection
        assert driver is not None
        verifier = _verifier(driver, name, password)
        template = s.CREATE_APP_ROLE if created else s.ALTER_APP_ROLE
        await driver.execute(template.format(verifier=verifier, **names))
        statements = [template.format(verifier="SCRAM-SHA-256$…", **names)]
        sequences = (
            await conn.execute(clause(s.IDENTITY_SEQUENCES), {"tables": list(s.AUDIT_TABLES)})
        ).scalars()
        grants = [grant.format(**names) for grant in s.APP_ROLE_GRANTS]
        listed = ", ".join(sequences)
        if listed:
            grants.append(s.APP_ROLE_SEQUENCE_GRANT.format(sequences=listed, **names))
        for statement in grants:
            await driver.execute(statement)
            statements.append(statement)
    warnings = []
    if context["public_create"]:
        warnings.append(
            f"PUBLIC may create objects in schema {context['schema']}, so this role can too: "
            f"run REVOKE CREATE ON SCHEMA {names['schema']} FROM PUBLIC"
        )
    logger.info("application role %s %s", name, "created" if created else "reset")
    return RoleReport(
        role=name,
        created=created,
        database=context["database"],
        schema=context["schema"],
        statements=statements,
        warnings=warnings,
    )


def _verifier(driver: Any, name: str, password: str) -> str:
    """The SCRAM-SHA-256 verifier of ``password`` for role ``name``, computed by libpq."""
    verifier = driver.pgconn.encrypt_password(
        password.encode("utf-8"), name.encode("utf-8"), b"scram-sha-256"
    ).decode("ascii")
    if not _VERIFIER.fullmatch(verifier):
        raise RuntimeError("libpq returned an unexpected password verifier")
    return str(verifier)
