"""``python -m mdq.cli``: the same as the ``mdq`` console script."""

from mdq.cli.main import app

app(prog_name="mdq")
