"""The bus contract: Python generated from proto/mdq/v1/mdq.proto (``make proto``)."""

from mdq.contracts import mdq_pb2 as pb

__all__ = ["pb"]
