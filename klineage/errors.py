"""Errors that name the problem: every bad input raises one of these with a readable message."""


class KLineageError(Exception):
    """Base class; the CLI prints its message without a traceback."""


class DocumentError(KLineageError, ValueError):
    """A document (problem, launch plan, verdict, lineage ...) is malformed."""

    def __init__(self, where: str, message: str):
        self.where = where
        self.message = message
        super().__init__(f"{where}: {message}")


class ExpressionError(DocumentError):
    """A launch-plan or predicate expression is not allowed or cannot be evaluated."""


class ToolchainError(KLineageError):
    """nvcc or cuobjdump is missing or unusable."""


class ReplayMiss(KLineageError):
    """Replay mode was asked for a verdict that was never recorded."""
