"""Text from a model made safe to show on a terminal.

Names in an ONNX model (inputs, outputs, nodes) are arbitrary strings: one holding an ANSI
escape sequence, a carriage return or a bidirectional override could recolor, overwrite or
reorder what the command line prints. Everything the ``opfusion`` command prints goes through
:func:`printable`, which writes such characters as Python's ``repr`` does (``\\x1b``,
``\\r``, ``\\u202e``)."""

from __future__ import annotations

import re

# C0 controls (but tab and newline), DEL and the C1 controls; then the invisible and
# direction-changing format characters: Arabic letter mark, zero-width space/joiners and the
# left-to-right/right-to-left marks, line and paragraph separators, bidirectional embeddings,
# overrides and isolates, the word joiner and invisible operators, the byte-order mark and the
# interlinear annotation characters.
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e"
                     "\u2060-\u2069\ufeff\ufff9-\ufffb]")
_UNSAFE_OR_BREAK = re.compile(f"{_UNSAFE.pattern[:-1]}\t\n]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    named = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}.get(match.group())
    if named:
        return named
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: object, keep_newlines: bool = True) -> str:
    """``str(text)`` with terminal control and invisible direction characters escaped;
    newlines and tabs stay unless ``keep_newlines`` is False (for text that must stay on one
    line)."""
    pattern = _UNSAFE if keep_newlines else _UNSAFE_OR_BREAK
    return pattern.sub(_escape, str(text))
