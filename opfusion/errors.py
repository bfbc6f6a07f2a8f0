"""The exceptions opfusion raises for a user's mistake.

Every message says what went wrong, where (node, op, attribute or input) and what to do.
Internal invariants may still assert; those are bugs, not user errors."""

from __future__ import annotations


class OpfusionError(Exception):
    """Base class of every error opfusion raises on bad input."""


class OpfusionTypeError(OpfusionError):
    """Type inference failed: shapes or dtypes that an operator cannot accept."""


class OpAttributeError(OpfusionError):
    """An operator attribute is missing, unknown or has a bad value."""


class UnknownOpError(OpfusionError):
    """An operator name that is not declared in opfusion.ops."""


class ParseError(OpfusionError):
    """The text IR could not be parsed; the message gives line, column and what was expected."""

    def __init__(self, message: str, line: int, column: int, source_line: str = "") -> None:
        self.line = line
        self.column = column
        pointer = ""
        if source_line:
            pointer = f"\n  {source_line}\n  {' ' * max(column - 1, 0)}^"
        super().__init__(f"line {line}, column {column}: {message}{pointer}")


class EvaluationError(OpfusionError):
    """The reference interpreter was given inputs it cannot run (missing, wrong shape or dtype)."""
