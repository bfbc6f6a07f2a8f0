"""Translation units: how a generated C file is split to be compiled by several processes.

The emitter lays a model's C out in sections (:func:`opfusion.backend.cpu.emitter.assemble_c`):
a prelude (includes, helper types, ``static inline`` helpers, declarations), one section per
kernel and the table section, each section beginning with a :data:`SECTION_MARKER` line. The
whole file is one valid translation unit; :func:`translation_units` also makes several of it,
one per compiler process: each is the prelude and a share of the sections, balanced by size.
The units depend only on the source and the number of processes, so the source (which the
cache key hashes) covers every unit."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

#: A line that begins a section of generated C (``//@opfusion-section kernel <name>`` or
#: ``//@opfusion-section table``); what comes before the first one is the prelude, which
#: every translation unit starts with.
SECTION_MARKER = "//@opfusion-section "

#: Sections are shared among translation units only when each unit gets at least this many
#: bytes of them. Measured with ``benchmarks/compile_time.py --crossover`` on two idle cores:
#: one more compiler process (start-up, the prelude, the link) costs ~0.01-0.03 s, so a 6 KiB
#: source compiles as fast whole as split in two (0.97x-1.09x), and from 9 KiB the split
#: gains (1.09x; 1.25x at 18 KiB, 1.4x-1.6x from 40 KiB).
MIN_UNIT_BYTES = 4 * 1024


def build_jobs() -> int:
    """How many compiler processes a build runs at once: the cores this process may use on
    the machine that builds (not the target's, which may be another machine)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


@dataclass(frozen=True)
class Section:
    """A section of generated C: its name (``kernel <name>`` or ``table``), its text, and the
    line of the whole source it begins on (1-based)."""

    name: str
    text: str
    first_line: int


def split_sections(source: str) -> tuple[str, list[Section]]:
    """The prelude of ``source`` (everything before the first section) and its sections; a
    source without :data:`SECTION_MARKER` lines is all prelude."""
    lines = source.splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if line.startswith(SECTION_MARKER)]
    if not starts:
        return source, []
    sections = []
    for k, begin in enumerate(starts):
        end = starts[k + 1] if k + 1 < len(starts) else len(lines)
        name = lines[begin][len(SECTION_MARKER):].strip()
        sections.append(Section(name, "".join(lines[begin:end]), begin + 1))
    return "".join(lines[:starts[0]]), sections


def translation_units(source: str, jobs: int, source_path: Path | None = None
                      ) -> list[tuple[str, str]]:
    """``source`` as ``(description, text)`` translation units for ``jobs`` compiler processes:
    ``[("", source)]`` (compile it whole) when it has fewer than two kernel sections (a
    one-kernel model gains nothing) or too little text for each unit to get
    :data:`MIN_UNIT_BYTES`; otherwise up to ``jobs`` units (no more than kernels), each the
    prelude and a share of the sections balanced by size (largest first, each to the unit with
    the least text so far; within a unit, in the source's order). ``#line`` directives make
    the compiler's messages name lines of ``source_path`` (the whole source kept on disk)."""
    prelude, sections = split_sections(source)
    size = sum(len(section.text) for section in sections)
    kernels = sum(1 for section in sections if section.name != "table")
    count = min(jobs, kernels, size // MIN_UNIT_BYTES)
    if count < 2:
        return [("", source)]
    shares: list[list[int]] = [[] for _ in range(count)]
    loads = [0] * count
    for index in sorted(range(len(sections)), key=lambda i: (-len(sections[i].text), i)):
        unit = min(range(count), key=lambda u: (loads[u], u))
        shares[unit].append(index)
        loads[unit] += len(sections[index].text)
    name = _c_string(str(source_path)) if source_path is not None else None
    units = []
    for share in shares:
        share.sort()
        text = [_line_directive(1, name), prelude]
        for index in share:
            text += [_line_directive(sections[index].first_line, name), sections[index].text]
        units.append((_describe_share([sections[i].name for i in share]), "".join(text)))
    return units


def _line_directive(line: int, name: str | None) -> str:
    return f"#line {line}\n" if name is None else f"#line {line} {name}\n"


def _c_string(text: str) -> str | None:
    """``text`` as a C string literal, or None if it holds characters a ``#line`` file name
    cannot (then units keep their own line numbers)."""
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in text):
        return None
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _describe_share(names: list[str]) -> str:
    kernels = [name.removeprefix("kernel ") for name in names if name.startswith("kernel ")]
    parts = ["kernel table"] if "table" in names else []
    if kernels:
        shown = ", ".join(kernels[:3]) + (f" and {len(kernels) - 3} more"
                                          if len(kernels) > 3 else "")
        parts.append(f"kernel{'s' if len(kernels) > 1 else ''} {shown}")
    return "; ".join(parts)
