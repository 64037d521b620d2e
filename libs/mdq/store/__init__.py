"""PostgreSQL: the queryable projection of the event log (docs/architecture.md, invariants 1 and 2).

``models`` defines the tables, ``migrations`` (Alembic) creates them, ``migrate.upgrade`` applies
the migrations, ``engine`` opens connections and ``queries`` reads the tables for the CLI. Only
the watcher's projector writes these tables; everything in them can be rebuilt from the log.
"""
