"""watcher: the single writer of PostgreSQL, and the translator of pod updates and silence
into job lifecycle events."""
