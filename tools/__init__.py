"""Tools that test and exercise mdq from outside and are not shipped in its wheel: the
container image builder (``tools.images``, ``make images``) and the chaos campaign
(``tools.chaos``, ``make chaos``). Test doubles stay in ``mdq.testing``."""
