"""The data plane: the PostgreSQL store a turn and an application call.

:class:`pgmemory.store.store.MemoryStore` is the public front; each of its methods hands over
to the module that owns the concern:

* ``_engine`` – where and how every statement runs: the database's verbs and life cycle, the
  deployment decided once, the unit of work, the fast path on psycopg, the driver's errors;
  ``embedded`` runs the embedded server, ``migrate`` runs the migrations;
* ``catalogue`` – collections (vector size and model) and embedding texts for them;
* ``writes`` – storing memories: batched inserts and bulk COPY imports;
* ``reads`` – search, pages in time order, counts;
* ``ann`` – the approximate (HNSW or IVFFlat) path for large scopes;
* ``recall`` – the recall audit;
* ``erasure`` – deleting memories by id, scope or expiry, and erasing a user;
* ``history`` – chat history; ``facts`` – facts per scope and namespace.

Shared by them: ``records`` (the value types), ``validation`` (input checks), ``columns`` (a
memory row's columns, defined once), ``queries`` (every data statement), ``routing`` (how the
statements spread over Citus), ``models`` (the schema), ``uuid7`` (time-ordered ids).

What operators do (user directory, audit pages, retention, audit verify, roles, partitioning)
is the admin plane, :mod:`pgmemory.admin`, which builds on this package; nothing here imports it.
"""
