"""Tools that test and exercise mdq from outside and are not shipped in its wheel: the
container image builder (``tools.images``, ``make images``), the chaos campaign (``tools.chaos``,
``make chaos``), and the steps the tests and the benchmarks share (``tools.submitting``,
``tools.processes``). Test doubles stay in ``mdq.testing``."""
