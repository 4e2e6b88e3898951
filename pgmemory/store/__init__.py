"""The PostgreSQL store: memories, their audit trail, chat history and facts.

:class:`pgmemory.store.store.MemoryStore` is the public front; each of its methods hands over
to the module that owns the concern:

* ``database`` – where the database is, its life cycle, and connections (transaction or
  autocommit); ``connector`` builds the engine, ``embedded`` runs the embedded server,
  ``migrate`` runs the alembic migrations;
* ``catalogue`` – collections (vector size and model) and embedding texts for them;
* ``writes`` – storing memories: batched inserts and bulk COPY imports;
* ``reads`` – search, pages in time order, counts;
* ``ann`` – the approximate (HNSW) path for large scopes;
* ``recall`` – the recall audit;
* ``erasure`` – deleting memories by id, scope or expiry, and erasing a user;
* ``history`` – chat history; ``facts`` – facts per scope and namespace.

Shared by them: ``records`` (the value types), ``validation`` (input checks), ``columns`` (a
memory row's columns, defined once), ``queries`` (every SQL statement), ``models`` (the schema).
"""
