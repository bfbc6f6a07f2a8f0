"""The fusion groups of a module drawn as a Graphviz graph.

:func:`fusion_to_dot` returns DOT text: the unfused dataflow graph with one cluster per group
FuseOps would make (labelled with its kind and anchor), edges inside a group solid and edges
between groups dashed. Paste it into any Graphviz viewer, or call :func:`render_fusion_svg`
when the ``graphviz`` package (and the Graphviz programs) are installed."""

from __future__ import annotations

from ...errors import OpfusionError
from ...ir.expr import Call, Constant, Expr, Function, Var
from ...ir.module import IRModule
from ...ir.op import Op, OpPatternKind
from ..context import PassContext
from .explain import node_label, temporary_names
from .partition import FuseOptions, FusionPlan, plan_fusion

# Fill colours by the group's kind (light, so black labels stay readable).
_KIND_COLOURS = {
    "kElemWise": "#e8f4e8", "kBroadcast": "#e8f0f8", "kInjective": "#fdf3e1",
    "kCommReduce": "#f3e8f8", "kOutEWiseFusable": "#fde8e8", "kTuple": "#f0f0f0",
    "kOpaque": "#eeeeee",
}


def fusion_to_dot(mod: IRModule | Function, fuse_opt_level: int = -1,
                  include_constants: bool = True, ctx: PassContext | None = None) -> str:
    """Graphviz DOT text of ``mod``'s dataflow with one cluster per fused group (the groups
    ``FuseOps(fuse_opt_level)`` makes under ``ctx``, default the current context)."""
    options = FuseOptions.from_context(ctx, fuse_opt_level)
    if isinstance(mod, Function):
        functions, module = {"main": mod}, None
    else:
        functions, module = mod.functions, mod
    lines = ["digraph fusion {", '  rankdir=TB;', '  node [shape=box, style="rounded,filled", '
             'fillcolor=white, fontname="Helvetica", fontsize=10];',
             '  edge [fontname="Helvetica", fontsize=9];']
    for number, (name, func) in enumerate(functions.items()):
        if func.is_primitive:
            continue
        plan = plan_fusion(func, options, mod=module)
        prefix = f"f{number}_"
        indent = "  "
        if len(functions) > 1:
            lines.append(f'  subgraph cluster_{prefix}main {{')
            lines.append(f'    label="@{_escape(name)}"; style=solid; color=gray40;')
            indent = "    "
        lines.extend(_function_lines(plan, prefix, indent, include_constants))
        if len(functions) > 1:
            lines.append("  }")
    lines.append("}")
    return "\n".join(lines)


def _function_lines(plan: FusionPlan, prefix: str, indent: str,
                    include_constants: bool) -> list[str]:
    names = temporary_names(plan.func)
    nodes = plan.graph.nodes
    shown = [node for node in nodes
             if include_constants or not isinstance(node.ref, Constant)
             or plan.root_of[node.index] != node.index]
    visible = {node.index for node in shown}
    lines: list[str] = []
    members: dict[int, list[int]] = {}
    for node in shown:
        members.setdefault(plan.root_of[node.index], []).append(node.index)
    clusters = 0
    for root, indices in members.items():
        root_ref = nodes[root].ref
        fused = (isinstance(root_ref, Call) and isinstance(root_ref.op, Op)) or len(indices) > 1
        inner = indent
        if fused:
            kind = _kind_name(plan.group_pattern[root])
            anchor = plan.group_anchor[root]
            title = f"group {clusters}: {kind}"
            clusters += 1
            if anchor >= 0:
                title += f", anchor {node_label(nodes[anchor].ref, names)}"
            lines.append(f"{indent}subgraph cluster_{prefix}{root} {{")
            lines.append(f'{indent}  label="{_escape(title)}"; style="rounded,filled"; '
                         f'fillcolor="{_KIND_COLOURS.get(kind, "#f8f8f8")}"; color=gray60;')
            inner = indent + "  "
        for index in indices:
            lines.append(f"{inner}{prefix}n{index} [{_node_attrs(nodes[index].ref, names)}];")
        if fused:
            lines.append(f"{indent}}}")
    for node in shown:
        for edge in node.outputs:
            if edge.node.index not in visible:
                continue
            same = plan.root_of[node.index] == plan.root_of[edge.node.index]
            style = "" if same else " [style=dashed, color=gray50]"
            lines.append(f"{indent}{prefix}n{node.index} -> {prefix}n{edge.node.index}{style};")
    return lines


def _node_attrs(expr: Expr, names: dict[Expr, str]) -> str:
    label = _escape(node_label(expr, names))
    if isinstance(expr, Var):
        return f'label="{label}", shape=ellipse, fillcolor="#ffffff"'
    if isinstance(expr, Constant):
        return f'label="{label}", shape=note, fontsize=8'
    return f'label="{label}"'


def _kind_name(kind: int) -> str:
    return OpPatternKind(kind).name


def _escape(text: str) -> str:
    """Text safe inside a double-quoted DOT string (names may come from a model file)."""
    return (text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
            .replace("\r", ""))


def render_fusion_svg(mod: IRModule | Function, path: str | None = None,
                      fuse_opt_level: int = -1, ctx: PassContext | None = None) -> str:
    """SVG of :func:`fusion_to_dot` (needs ``pip install graphviz`` and the Graphviz programs);
    also written to ``path`` when given."""
    try:
        import graphviz
    except ImportError:
        raise OpfusionError("render_fusion_svg needs the graphviz package: pip install "
                            "graphviz (and the Graphviz programs, e.g. apt install graphviz); "
                            "fusion_to_dot gives the DOT text without it") from None
    svg = graphviz.Source(fusion_to_dot(mod, fuse_opt_level, ctx=ctx)).pipe(
        format="svg", encoding="utf-8")
    if path is not None:
        with open(path, "w", encoding="utf-8") as file:
            file.write(svg)
    return svg
