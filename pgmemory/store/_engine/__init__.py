"""The engine: where every statement of pgmemory runs, and how.

One direction, top to bottom; nothing here imports the domain modules above it
(``reads``, ``writes``, ``recall``, ``history``, ``erasure``, ``facts``, the admin plane):

* ``database`` – :class:`~pgmemory.store._engine.database.Database`, the verbs every statement
  runs by (``read``, ``read_rows``, ``fetch``, ``audited``, ``write``, ``unit_of_work``,
  ``ddl``), the store's life cycle and its connections; ``deployment`` decides once, when the
  store opens, how a verb runs on this server (locks in the statement or a lock pipeline, the
  audit row inline, apart on Citus or after a replica's read);
* ``unit_of_work`` – a unit of work's one transaction and the locks a write holds;
* ``fastpath`` – one statement (with its locks) as one prepared round trip on psycopg, and a
  deferred unit's writes as one; ``binary`` writes its parameters in the binary format;
* ``connections`` – where the database is and every connection to it (the pools, the embedded
  server, the replicas, read-your-writes); below the verbs and the unit of work, which both
  take their connections there;
* ``held`` – the pooled connections kept between fast-path statements; ``connector`` makes
  the engine and explains what the deployment refuses; ``replicas`` routes reads to hot
  standbys; ``lifecycle`` closing and forking; ``retry`` the read retry;
* ``driver_errors`` – what the driver raises, as pgmemory's errors (``addresses``: a
  database's URL and a failed connection, in words); ``clauses`` – statements as SQLAlchemy
  clauses, made once.

Private to pgmemory: applications use :class:`pgmemory.MemoryStore` and
:class:`pgmemory.admin.Admin`. This package's ``__init__`` imports nothing, so that the
command line's start-up can import ``addresses`` alone.
"""
