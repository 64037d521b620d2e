"""``mdq simulate``: scheduler configurations compared on one workload in virtual time, through
the production scheduling core (docs/simulate.md)."""
