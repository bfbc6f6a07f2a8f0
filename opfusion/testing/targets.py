"""Targets the tests compile for besides the host: every model must match the reference on
each of them too."""

from __future__ import annotations

from ..target import Target, host_arch

#: ISA levels below the host's that its CPU still runs (an artifact for an older machine is
#: built and checked here): AVX2 with FMA on an x86 host that has more.
OLDER_ISA_TARGETS = {"x86_64": ["c -mattr=+avx2,+fma"]}


def other_targets() -> list[str]:
    """Target strings, other than the host's, whose code this machine runs."""
    host = Target("c")
    found = []
    for spec in OLDER_ISA_TARGETS.get(host_arch(), []):
        target = Target(spec)
        if not target.missing_on_host() and target.features != host.features:
            found.append(spec)
    return found


#: :func:`other_targets`, computed at import.
OTHER_TARGETS = other_targets()
