"""Alembic coexistence: keep a host application's autogenerate away from pgmemory's tables.

pgmemory manages its own schema with its own alembic version table, so an application that runs
``alembic revision --autogenerate`` against the same database would otherwise see pgmemory's
tables as strays and propose to drop them. Pass :func:`include_object` to the host's
``context.configure(...)`` in its ``env.py``::

    from pgmemory.integrations.alembic import include_object

    context.configure(connection=connection, target_metadata=target_metadata,
                      include_object=include_object)

pgmemory reserves table names that start with ``pgmemory_``.
"""

from __future__ import annotations

from pgmemory.store.migrate import is_pgmemory_table


def include_object(
    object: object,
    name: str | None,
    type_: str,
    reflected: bool,
    compare_to: object | None,
) -> bool:
    """Alembic's ``include_object`` hook: False for pgmemory's tables and everything on them.

    Tables (pgmemory's data tables and its version table) are recognised by name; indexes,
    constraints and columns by the table they belong to. Everything else is left to the host.

    Args:
        object: the schema item alembic is comparing (a Table, Index, Column, constraint...).
        name: its name.
        type_: ``"table"``, ``"index"``, ``"column"``, ``"unique_constraint"`` or
            ``"foreign_key_constraint"``.
        reflected: True when the item was read from the database rather than the host's models.
        compare_to: the other side of the comparison, if any.

    Returns:
        Whether alembic should consider the item.
    """
    if type_ == "table":
        return not is_pgmemory_table(name)
    table = getattr(object, "table", None)
    table_name = getattr(table, "name", None)
    return not is_pgmemory_table(table_name)


__all__ = ["include_object"]
