"""The pure core of mdq: job model, state machine, placement scoring, recovery policy, convergence.

Nothing in this package performs I/O or imports a bus, database or cluster client (an
import-linter contract enforces it). Services feed it plain values and publish what it returns,
so every rule can be tested with tables of named cases.
"""
