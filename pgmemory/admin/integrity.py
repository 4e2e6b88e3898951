"""Checking that the audit is intact: the guard of migration 0006, and every row's hash.

The audit tables are append-only for everyone but the sanctioned functions
(``pgmemory_erase_user_audit``, ``pgmemory_prune_audit``), enforced by privileges (an
application role gets INSERT and SELECT only, see :mod:`pgmemory.admin.roles`) and by a guard
trigger that refuses UPDATE, DELETE and TRUNCATE and stamps each new row with ``row_sha256``.
:func:`verify` reads that arrangement back and recomputes every row's hash; it changes nothing
(its one probe, an UPDATE the guard must refuse, runs in a transaction that is rolled back).

What it can and cannot see: a disabled or dropped trigger, a replaced or re-owned function,
a grant that lets another role change audit rows, a role that may act as the owner, a row edited
while the guard was off (its hash no longer matches), pseudonyms no erasure recorded. An owner
who edits a row and recomputes its hash, or deletes whole rows with the guard off and restores
it, leaves no trace inside the database; nor does a superuser. Compare the row counts and
highest ids it reports with copies kept outside the database to notice vanished rows.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.exc import DBAPIError

from pgmemory.admin import statements as s
from pgmemory.store._engine.clauses import clause
from pgmemory.store._engine.database import Database

logger = logging.getLogger(__name__)

#: pg_trigger.tgtype bits: ROW 1, BEFORE 2, INSERT 4, DELETE 8, UPDATE 16, TRUNCATE 32.
_GUARD_TYPE = 1 | 2 | 4 | 8 | 16
_NO_TRUNCATE_TYPE = 2 | 32
_EXPECTED_TYPE = {
    "pgmemory_audit_guard": _GUARD_TYPE,
    "pgmemory_audit_no_truncate": _NO_TRUNCATE_TYPE,
}
#: pg_trigger.tgenabled values under which a trigger fires in normal sessions.
_FIRING = {"O", "A"}


@dataclass(frozen=True)
class Check:
    """One verified property of the audit.

    Attributes:
        name: what was checked, e.g. ``guard triggers``.
        ok: whether it holds.
        detail: what was found (on failure: the problem and where).
    """

    name: str
    ok: bool
    detail: str

    def as_dict(self) -> dict[str, Any]:
        """The check for ``--json``."""
        return {"name": self.name, "ok": self.ok, "detail": self.detail}


@dataclass(frozen=True)
class AuditReport:
    """What :func:`verify` found.

    Attributes:
        checks: every check, in order.
        tables: per audit table, ``{"rows": n, "max_id": id or None}`` (keep these outside the
            database to notice rows that vanish).
        notes: what the checks cannot rule out (e.g. the superusers, who bypass everything).
    """

    checks: list[Check]
    tables: dict[str, dict[str, int | None]]
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Whether every check passed."""
        return all(c.ok for c in self.checks)

    @property
    def problems(self) -> list[Check]:
        """The failed checks."""
        return [c for c in self.checks if not c.ok]

    def as_dict(self) -> dict[str, Any]:
        """The report for ``--json``."""
        return {
            "ok": self.ok,
            "checks": [c.as_dict() for c in self.checks],
            "tables": self.tables,
            "notes": self.notes,
        }


async def verify(db: Database) -> AuditReport:
    """Check the audit's guard and every audit row's hash (reads only; a full scan of the audits).

    Args:
        db: the open database.

    Returns:
        The report; ``report.ok`` is False when anything is wrong, each failed check naming it.
    """
    tables = list(s.AUDIT_TABLES)
    checks: list[Check] = []
    summary: dict[str, dict[str, int | None]] = {}
    # One transaction on the primary (the guard probe's UPDATE needs it, and each probe is undone
    # by its own savepoint): it changes nothing but its SET LOCAL settings.
    async with db.write(users=()) as conn:
        triggers = (
            (await conn.execute(clause(s.AUDIT_TRIGGERS), {"tables": tables})).mappings().all()
        )
        checks.append(_check_triggers(triggers))
        functions = (
            (
                await conn.execute(
                    clause(s.AUDIT_FUNCTIONS),
                    {"names": [*s.DEFINER_FUNCTIONS, s.GUARD_FUNCTION]},
                )
            )
            .mappings()
            .all()
        )
        grants = (
            (
                await conn.execute(
                    clause(s.AUDIT_GRANTS),
                    {"tables": [*tables, s.SECRETS_TABLE], "secrets": s.SECRETS_TABLE},
                )
            )
            .mappings()
            .all()
        )
        owners = {
            r[0]
            for r in await conn.execute(
                clause(s.TABLE_OWNERS), {"tables": [*tables, s.SECRETS_TABLE]}
            )
        }
        checks.append(_check_functions(functions, owners))
        checks.append(_check_grants(grants))
        members: list[str] = []
        for owner in sorted(owners):
            found = await conn.execute(clause(s.ROLE_MEMBERS), {"role": owner})
            members += [r[0] for r in found]
        checks.append(
            Check(
                "owner roles",
                not members,
                f"roles that may act as the owner of the audits: {', '.join(members)}"
                if members
                else "no other role may act as the owner of the audits",
            )
        )
        await conn.execute(clause(s.HASH_TIME_ZONE))
        await conn.execute(clause(s.HASH_FLOAT_DIGITS))
        bad: list[str] = []
        for table in tables:
            row = (await conn.execute(clause(s.audit_row_check(table)))).mappings().one()
            summary[table] = {"rows": int(row["rows"]), "max_id": row["max_id"]}
            if row["mismatched"]:
                ids = ", ".join(str(i) for i in row["examples"])
                bad.append(f"{table}: {row['mismatched']} row(s), e.g. id {ids}")
        checks.append(
            Check(
                "row hashes",
                not bad,
                "rows changed after they were written: " + "; ".join(bad)
                if bad
                else f"{sum(int(s['rows'] or 0) for s in summary.values())} rows match "
                "their row_sha256",
            )
        )
        unrecorded = (
            await conn.execute(
                clause(s.UNRECORDED_PSEUDONYMS), {"erasure_namespace": s.ERASURE_NAMESPACE}
            )
        ).scalar_one()
        checks.append(
            Check(
                "erasure records",
                not unrecorded,
                f"{unrecorded} pseudonymised user(s) in the audits with no erasure record"
                if unrecorded
                else "every pseudonym in the audits has its erasure record",
            )
        )
        deletions = (await conn.execute(clause(s.UNAUDITED_DELETIONS))).mappings().one()
        checks.append(
            Check(
                "deletions",
                not deletions["deletions"],
                f"{deletions['deletions']} memory(ies) deleted with no audit row, the first at "
                f"{deletions['oldest']:%Y-%m-%d %H:%M:%S} UTC (deleted outside pgmemory's "
                "statements; pgmemory_deleted_memories holds their ids)"
                if deletions["deletions"]
                else "every deleted memory has its audit row",
            )
        )
        misuse = (
            (
                await conn.execute(
                    clause(s.AUDIT_MISUSE),
                    {
                        "erasure_namespace": s.ERASURE_NAMESPACE,
                        "retention_namespace": s.RETENTION_NAMESPACE,
                    },
                )
            )
            .mappings()
            .one()
        )
        checks.append(_check_misuse(misuse))
        checks.append(await _probe(conn, tables, summary))
        superusers = [r[0] for r in await conn.execute(clause(s.SUPERUSERS))]
    notes = [
        f"superusers ({', '.join(superusers)}) bypass privileges and may disable the guard; "
        "so may the owner of the audit tables. Row hashes reveal edits made while the guard was "
        "off, unless the hash was recomputed; compare the row counts and highest ids with a copy "
        "kept outside the database to notice deleted rows.",
        "pgmemory_recall_audit rows are the application's own statement of what it showed: a "
        "recall changes nothing the database could check it against, so the guard checks only "
        "that every memory a row names is one of its user's, in its collection.",
    ]
    report = AuditReport(checks=checks, tables=summary, notes=notes)
    logger.info("audit verified: %s", "ok" if report.ok else f"{len(report.problems)} problem(s)")
    return report


def _check_misuse(row: Any) -> Check:
    """What a misuse of the audit functions leaves (before migration 0009 refused it)."""
    found = [
        f"{row['moved_records']} erasure or prune record(s) moved off the records user or blanked"
        if row["moved_records"]
        else "",
        f"{row['future_prunes']} prune(s) with a cutoff later than the prune itself"
        if row["future_prunes"]
        else "",
        f"{row['live_but_erased']} live memorie(s) whose insert audit row carries a pseudonym"
        if row["live_but_erased"]
        else "",
    ]
    problems = [p for p in found if p]
    return Check(
        "audit function misuse",
        not problems,
        "; ".join(problems)
        if problems
        else "the audit's records are in place, no prune reached the future, no live memory's "
        "audit was erased",
    )


def _check_triggers(rows: Any) -> Check:
    found = {(r["table_name"], r["trigger_name"]): r for r in rows}
    problems = []
    for table in s.AUDIT_TABLES:
        for name in s.GUARD_TRIGGERS:
            row = found.get((table, name))
            if row is None:
                problems.append(f"{table}: trigger {name} is missing")
            elif row["enabled"] not in _FIRING:
                problems.append(f"{table}: trigger {name} is disabled (tgenabled {row['enabled']})")
            elif row["function_name"] != s.GUARD_FUNCTION:
                problems.append(f"{table}: trigger {name} runs {row['function_name']}")
            elif row["type_bits"] != _EXPECTED_TYPE[name]:
                problems.append(f"{table}: trigger {name} fires on other events")
    if problems:
        return Check("guard triggers", False, "; ".join(problems))
    return Check("guard triggers", True, "enabled on every audit table")


def _check_functions(rows: Any, owners: set[str]) -> Check:
    found = {r["name"]: r for r in rows}
    problems = []
    for name in (*s.DEFINER_FUNCTIONS, s.GUARD_FUNCTION):
        row = found.get(name)
        if row is None:
            problems.append(f"function {name} is missing")
            continue
        if row["owner"] not in owners:
            problems.append(f"function {name} is owned by {row['owner']}, not the audits' owner")
        if name == s.GUARD_FUNCTION:
            continue
        if not row["definer"]:
            problems.append(f"function {name} is not SECURITY DEFINER")
        if not any(str(c).startswith("search_path=") for c in row["config"]):
            problems.append(f"function {name} has no pinned search_path")
        if row["public_execute"]:
            problems.append(f"function {name} may be executed by PUBLIC")
    if len(owners) > 1:
        problems.append(f"the audit tables have several owners: {', '.join(sorted(owners))}")
    if problems:
        return Check("guard functions", False, "; ".join(problems))
    return Check("guard functions", True, f"owned by {', '.join(sorted(owners))}")


def _check_grants(rows: Any) -> Check:
    problems = [f"{r['grantee']} holds {r['privilege_type']} on {r['table_name']}" for r in rows]
    if problems:
        return Check("grants", False, "; ".join(problems))
    return Check(
        "grants", True, "no role but the owner may change audit rows or read the user secrets"
    )


async def _probe(conn: Any, tables: list[str], summary: dict[str, dict[str, int | None]]) -> Check:
    """Try a no-op UPDATE of each non-empty audit table in a savepoint: the guard must refuse."""
    problems, untested = [], []
    for table in tables:
        if not summary[table]["rows"]:
            continue
        try:
            async with conn.begin_nested() as savepoint:
                await conn.execute(clause(s.audit_guard_probe(table)))
                await savepoint.rollback()
            problems.append(f"{table}: an UPDATE of an audit row was not refused")
        except DBAPIError as exc:
            message = str(getattr(getattr(exc.orig, "diag", None), "message_primary", "") or "")
            if not message.startswith("pgmemory:"):
                untested.append(table)
    if problems:
        return Check("guard probe", False, "; ".join(problems))
    if untested:
        return Check(
            "guard probe",
            True,
            "privileges refused the probe before the guard could (run verify as the owner to "
            f"probe the guard itself): {', '.join(untested)}",
        )
    return Check("guard probe", True, "UPDATE of an audit row refused by the guard")
