"""The web console: the jobs' history from PostgreSQL and their live progress from NATS, as
pages a person opens in a browser (``python -m services.console``; docs/console.md)."""
