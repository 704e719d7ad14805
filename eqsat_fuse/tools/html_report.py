"""The visual report: one self-contained HTML page that shows what a compilation did.

    eqsat-fuse optimize model.onnx --report model.html
    compiled.report_html("model.html")            # or html_report.write(compiled, path)

The page holds the original graph and the fused graph as pictures (Graphviz, rendered to SVG and
inlined; each kernel of the fused graph is a box labelled with its name and ops, and links to its
row of the kernel table), the kernels with their predicted cost breakdown, the memory plan as a
timeline (matplotlib, inlined SVG: buffers as bars over kernel steps x arena offset, and the bytes
live at each step against the liveness lower bound), and the saturation statistics per rule.

It loads nothing: no script, style sheet, font or image comes from outside the file, and its
Content-Security-Policy forbids the browser to fetch anything. Every name taken from the model is
escaped (HTML text, Graphviz labels), and the one inline script runs only through the hash that
the policy allows, so a node named `<script>...</script>` shows as text and never runs.

Graphviz's `dot` program (Debian: `graphviz`) and the Python packages `graphviz` and `matplotlib`
are needed; `check_requirements()` says what is missing before a long compilation starts.
"""

from __future__ import annotations

import base64
import hashlib
import html
import io
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from ..errors import EqsatFuseError
from ..files import write_atomically

if TYPE_CHECKING:
    from ..pipeline import Compiled

MAX_GRAPH_NODES = 4000      # pictures with more nodes than this are not drawn (dot gets slow)
MAX_LABEL = 32              # characters of a name shown in a graph label (all of it in tooltips)

_ANCHORS = {"Conv", "ConvTranspose", "MatMul", "Gemm", "ConvInteger", "Einsum", "LSTM", "GRU",
            "RNN", "Attention", "MatMulInteger", "QLinearConv", "QLinearMatMul"}
_REDUCTIONS = {"Softmax", "LogSoftmax", "LayerNormalization", "BatchNormalization",
               "GlobalAveragePool", "GlobalMaxPool", "AveragePool", "MaxPool", "LRN",
               "InstanceNormalization", "GroupNormalization", "ReduceMean", "ReduceSum",
               "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL2", "ArgMax", "ArgMin", "TopK"}
_VIEWS = {"Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Expand",
          "Slice", "Split", "Concat", "Gather", "Shape", "Pad", "Dropout", "Cast"}
_FILL = {"anchor": "#cfe0f7", "reduction": "#fde3c3", "view": "#eeeeee", "other": "#d9f2d9"}


# ---- entry points ------------------------------------------------------------------------------

def check_requirements() -> None:
    """Raise `EqsatFuseError` naming what the report needs and is missing here."""
    missing = []
    for module, why in (("graphviz", "the graph pictures"), ("matplotlib", "the memory plot")):
        try:
            __import__(module)
        except ImportError:
            missing.append(f"the Python package {module!r} ({why}): "
                           f"pip install {module}")
    if shutil.which("dot") is None:
        missing.append("Graphviz's `dot` program (the graph pictures): on Debian or Ubuntu, "
                       "apt-get install graphviz")
    if missing:
        raise EqsatFuseError("the HTML report needs " + "; and ".join(missing))


def write(compiled: Compiled, path: str | Path, *, force: bool = False,
          protect: Iterable[str | Path] = (), force_hint: str = "force=True") -> Path:
    """Write the HTML report of `compiled` to `path` and return the path.

    The file is written to a temporary name and renamed into place; an existing file is replaced
    only with `force`, and never one of `protect` (the input model). `force_hint` is how the
    caller asks for `force`, for the message (`--force` on the command line).
    """
    check_requirements()
    page = render(compiled).encode("utf-8")
    path = Path(path)
    write_atomically(path, lambda handle: handle.write(page), force=force,
                     protect=[Path(p) for p in protect], force_hint=force_hint)
    return path


def render(compiled: Compiled, *, max_graph_nodes: int = MAX_GRAPH_NODES) -> str:
    """The report page as one HTML string."""
    report = compiled.report
    source = getattr(compiled, "_source", None)
    sections = [
        _section("graphs", "Graphs", _graphs(compiled, source, max_graph_nodes)),
        _section("kernels", "Kernels and their predicted cost", _kernel_table(compiled)),
        _section("memory", "Memory plan", _memory(compiled)),
        _section("saturation", "Saturation", _saturation(report)),
    ]
    script = _SCRIPT.strip()
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    policy = (f"default-src 'none'; style-src 'unsafe-inline'; img-src data:; "
              f"script-src 'sha256-{digest}'")
    title = f"eqsat-fuse report: {report.model}"
    return "\n".join([
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{policy}">',   # no " inside
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_e(title)}</title>",
        f"<style>{_CSS}</style>",
        "</head>",
        "<body>",
        _header(report),
        *sections,
        f'<footer>eqsat-fuse {_e(_version())}</footer>',
        f"<script>{script}</script>",
        "</body>",
        "</html>",
        "",
    ])


# ---- page parts --------------------------------------------------------------------------------

def _header(report) -> str:
    energy = (f", {report.energy_uj:,.1f} µJ" if report.energy_uj is not None else "")
    facts = [
        ("target", f"{report.target} (backend {report.backend}, extractor {report.extractor}, "
                   f"minimizing {report.objective})"),
        ("nodes", f"{report.nodes_in} ONNX nodes{report.conversion_note()} → "
                  f"{report.kernels_out} kernels "
                  f"(+ {report.views} views that move no data)"),
        ("predicted cost", f"{report.cost:,.2f} µs{energy}"),
        ("memory", f"arena {_bytes(report.peak_bytes)} (lower bound "
                   f"{_bytes(report.lower_bound_bytes)}, separate buffers "
                   f"{_bytes(report.separate_bytes)})"),
        ("saturation", f"{report.stop_reason} after {report.iterations} iterations, "
                       f"{report.egraph_nodes:,} e-nodes"),
        ("compile time", f"{sum(report.timings.values()):.2f} s"),
    ]
    rows = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in facts)
    nav = " · ".join(f'<a href="#{key}">{text}</a>' for key, text in
                     (("graphs", "graphs"), ("kernels", "kernels"), ("memory", "memory"),
                      ("saturation", "saturation")))
    return (f'<header><h1>eqsat-fuse report: <span class="model">{_e(report.model)}</span></h1>'
            f'<table class="facts">{rows}</table><nav>{nav}</nav>'
            f"<details><summary>text summary</summary><pre>{_e(report.summary())}</pre>"
            f"</details></header>")


def _section(key: str, title: str, body: str) -> str:
    return f'<section id="{key}"><h2>{_e(title)}</h2>{body}</section>'


def _graphs(compiled, source, max_nodes: int) -> str:
    if source is not None:
        folded = shape_arithmetic(source)
        count = len(source.graph.node) - len(folded)
        original = (_graph_figure("original", _original_dot(source, folded), count, max_nodes)
                    if count <= max_nodes else _too_big(count, max_nodes))
        collapsed = (f"; {_plural(len(folded), 'node')} of shape arithmetic folded at compile "
                     f"time (Shape, and what computes only from shapes and constants) collapsed "
                     f"into the nodes that read them" if folded else "")
        original_caption = (f"The model as given: {_plural(len(source.graph.node), 'ONNX node')}"
                            f" (weights and Constant nodes not drawn{collapsed}). Scroll the "
                            f"wheel to zoom, drag to pan.")
    else:
        original = '<p class="note">The original model is not available.</p>'
        original_caption = "The model as given."
    plan = compiled.plan
    count = sum(len(k.body) for k in plan.kernels)
    fused = (_graph_figure("fused", _fused_dot(compiled), count, max_nodes)
             if count <= max_nodes else _too_big(count, max_nodes))
    report = compiled.report
    fused_caption = (f"The compiled program: {_plural(report.kernels_out, 'kernel')}, each a "
                     f"box labelled with its name and ops (click one for its cost); dashed: "
                     f"{_plural(report.views, 'view')} that move no data.")
    toggle = '<button type="button" class="fit-toggle">actual size</button>'
    return ('<div class="graphs">'
            f'<figure id="original-graph"><figcaption><b>Original graph.</b> '
            f"{_e(original_caption)}{toggle}</figcaption>"
            f'<div class="picture fit">{original}</div></figure>'
            f'<figure id="fused-graph"><figcaption><b>Fused graph.</b> {_e(fused_caption)}'
            f'{toggle}</figcaption><div class="picture fit">{fused}</div></figure>'
            "</div>")


def _too_big(count: int, limit: int) -> str:
    return (f'<p class="note">{count} nodes: too many to draw (the limit is {limit}); the tables '
            f"below list every kernel.</p>")


def _graph_figure(prefix: str, graph, count: int, limit: int) -> str:
    import graphviz

    try:
        svg = graph.pipe(format="svg", encoding="utf-8")
    except graphviz.ExecutableNotFound:
        raise EqsatFuseError("the HTML report needs Graphviz's `dot` program: on Debian or "
                             "Ubuntu, apt-get install graphviz") from None
    except graphviz.CalledProcessError as exc:
        stderr = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr
        raise EqsatFuseError(f"Graphviz could not draw the {prefix} graph: {stderr}") from None
    return _inline_svg(svg, prefix)


def _inline_svg(svg: str, prefix: str) -> str:
    """An SVG document as an element to inline: no XML prologue, ids unique within the page."""
    svg = svg[svg.index("<svg"):]
    return re.sub(r'\bid="', f'id="{prefix}-', svg)     # dot numbers both graphs alike


# ---- graphs ------------------------------------------------------------------------------------

def _digraph(name: str):
    import graphviz

    graph = graphviz.Digraph(name)
    graph.attr("graph", rankdir="TB", fontname="Helvetica", fontsize="10", nodesep="0.25",
               ranksep="0.35", bgcolor="transparent")
    graph.attr("node", shape="box", style="rounded,filled", fontname="Helvetica",
               fontsize="10", height="0.3", margin="0.08,0.03", penwidth="0.8")
    graph.attr("edge", arrowsize="0.6", color="#555555", penwidth="0.8")
    return graph


def shape_arithmetic(model) -> set[int]:
    """Indices of the nodes that compute only from shapes and constants (Shape of any value,
    and what reads only such values, initializers and Constant outputs): the importer folds
    them away, so the picture collapses them. A node writing a graph output is kept."""
    g = model.graph
    static = {t.name for t in g.initializer}
    outputs = {o.name for o in g.output}
    folded: set[int] = set()
    for i, node in enumerate(g.node):
        if node.domain not in ("", "ai.onnx") or any(o in outputs for o in node.output):
            continue
        if node.op_type == "Shape" or (node.op_type != "Constant" and node.input and
                                       all(not x or x in static for x in node.input)):
            folded.add(i)
            static.update(o for o in node.output if o)
        elif node.op_type == "Constant":
            static.update(node.output)
    return folded


def _original_dot(model, collapsed: set[int] = frozenset()):
    graph = _digraph("original")
    g = model.graph
    weights = {t.name for t in g.initializer}
    producer: dict[str, str] = {}
    for i, value in enumerate(v for v in g.input if v.name not in weights):
        node_id = f"in{i}"
        graph.node(node_id, _label(value.name, _shape_of(value)), shape="ellipse",
                   fillcolor="#ffffff", tooltip=_tooltip(value.name))
        producer[value.name] = node_id
    for i, node in enumerate(g.node):
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx") or i in collapsed:
            continue            # a weight written as a node, or folded shape arithmetic
        node_id = f"n{i}"
        lines = [node.op_type] + ([node.name] if node.name else [])
        graph.node(node_id, _label(*lines), fillcolor=_FILL[_category(node.op_type)],
                   tooltip=_tooltip(f"{node.op_type} {node.name}".strip()))
        for name in node.input:
            if name in producer:
                graph.edge(producer[name], node_id)
        for name in node.output:
            if name:
                producer[name] = node_id
    for i, value in enumerate(g.output):
        node_id = f"out{i}"
        graph.node(node_id, _label(value.name, _shape_of(value)), shape="ellipse",
                   fillcolor="#ffffff", peripheries="2", tooltip=_tooltip(value.name))
        if value.name in producer:
            graph.edge(producer[value.name], node_id)
    return graph


def _fused_dot(compiled):
    plan = compiled.plan
    costs = {k.name: k for k in compiled.report.kernels}
    graph = _digraph("fused")
    graph.attr("graph", compound="true")
    producer: dict[str, str] = {}
    for i, name in enumerate(plan.inputs):
        node_id = f"in{i}"
        info = plan.inputs[name]
        graph.node(node_id, _label(name, _dims(info.shape)), shape="ellipse",
                   fillcolor="#ffffff", tooltip=_tooltip(name))
        producer[name] = node_id

    for step, kernel in enumerate(plan.kernels):
        body_ids = [f"k{step}_{j}" for j in range(len(kernel.body))]
        ops = [_body_op(node, plan) for node in kernel.body]
        cost = costs.get(kernel.name)
        if kernel.kind == "alias":
            node_id = body_ids[-1]
            graph.node(node_id, _label(f"{kernel.name}: {'+'.join(ops)}", "view", limit=64),
                       style="rounded,dashed,filled", fillcolor="#f4f4f4",
                       tooltip=_tooltip(f"{kernel.name} writes {kernel.output} (a view)"),
                       URL=f"#kernel-{step}")
            for name in kernel.inputs:
                if name in producer:
                    graph.edge(producer[name], node_id)
            producer[kernel.output] = node_id
            continue
        with graph.subgraph(name=f"cluster_k{step}") as box:
            title = _wrap_ops(kernel.name, ops)
            detail = _dims(kernel.info.shape) + (f" · {cost.predicted_us:,.2f} µs"
                                                 if cost is not None else "")
            box.attr(label=_label(*title, detail, limit=64), style="rounded,filled",
                     fillcolor="#fff7dc" if kernel.kind == "opaque" else "#eef4fb",
                     color="#7a8ca5", fontsize="10", labeljust="l", URL=f"#kernel-{step}",
                     tooltip=_tooltip(f"{kernel.name} writes {kernel.output}"))
            for j, (node, op) in enumerate(zip(kernel.body, ops)):
                box.node(body_ids[j], _label(op), fillcolor=_FILL[_category(node.op)],
                         tooltip=_tooltip(op))
        for j, node in enumerate(kernel.body):
            for arg in node.args:
                if arg.kind == "node":
                    graph.edge(body_ids[arg.ref], body_ids[j])
                elif arg.kind == "buffer" and arg.ref in producer:
                    graph.edge(producer[arg.ref], body_ids[j], tooltip=_tooltip(str(arg.ref)))
        producer[kernel.output] = body_ids[-1]

    for i, (name, ref) in enumerate(plan.outputs.items()):
        node_id = f"out{i}"
        graph.node(node_id, _label(name), shape="ellipse", fillcolor="#ffffff",
                   peripheries="2", tooltip=_tooltip(name))
        if ref in producer:
            graph.edge(producer[ref], node_id)
    return graph


def _body_op(node, plan) -> str:
    """An op's name for a picture; an opaque node shows the ONNX op it runs."""
    if node.op == "Opaque":
        onnx_node = getattr(plan.opaque_nodes.get(node.attrs.get("node")), "onnx_node", None)
        if onnx_node is not None:
            return f"Opaque {onnx_node.op_type}"
    return node.op


def _wrap_ops(name: str, ops: list[str], width: int = 40) -> list[str]:
    """`name: Op+Op+...` on lines of about `width` characters, broken after a `+`."""
    lines, line = [], f"{name}: "
    for i, op in enumerate(ops):
        piece = op + ("+" if i < len(ops) - 1 else "")
        if len(line) + len(piece) > width and line.strip() and not line.endswith(": "):
            lines.append(line)
            line = "  "
        line += piece
    lines.append(line)
    return lines


def _category(op: str) -> str:
    if op in _ANCHORS:
        return "anchor"
    if op in _REDUCTIONS:
        return "reduction"
    if op in _VIEWS:
        return "view"
    return "other"


def _shape_of(value) -> str:
    tensor = value.type.tensor_type
    if not tensor.HasField("shape"):
        return ""
    dims = [d.dim_param or (str(d.dim_value) if d.HasField("dim_value") else "?")
            for d in tensor.shape.dim]
    return "[" + ",".join(dims) + "]"


def _dims(shape) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _clean(text: str, limit: int | None = MAX_LABEL) -> str:
    """Text from the model, safe to place anywhere: no control characters, bounded length.

    A long name keeps its end: exporters name things by path (`/encoder/layer.0/.../MatMul`),
    and the last part tells them apart.
    """
    text = _CONTROL.sub("\N{REPLACEMENT CHARACTER}", str(text))
    if limit is not None and len(text) > limit:
        text = "…" + text[len(text) - limit + 1:]
    return text


def _dot_text(text: str, limit: int | None) -> str:
    """One line of a Graphviz label: backslashes and `&` literal (dot reads `\\n`, `&amp;`)."""
    return _clean(text, limit).replace("\\", "\\\\").replace("&", "&amp;")


def _label(*lines: str, limit: int = MAX_LABEL):
    """A plain (never HTML-like) Graphviz label of escaped lines."""
    import graphviz

    return graphviz.nohtml("\\n".join(_dot_text(line, limit) for line in lines if line))


def _tooltip(text: str):
    import graphviz

    return graphviz.nohtml(_dot_text(text, 300))


# ---- kernel table ------------------------------------------------------------------------------

def _kernel_table(compiled) -> str:
    report = compiled.report
    kernels = report.kernels
    energy = report.energy_uj is not None or any(k.energy_uj is not None for k in kernels)
    total_us = sum(k.predicted_us for k in kernels) or 1.0
    head = ["#", "kernel", "kind", "ops", "output", "shape", "launch µs", "read", "written",
            "FLOPs", "predicted µs", "share"] + (["energy µJ"] if energy else [])
    numeric = {"#", "launch µs", "read", "written", "FLOPs", "predicted µs", "share", "energy µJ"}
    plan_kernels = compiled.plan.kernels
    rows = []
    for step, k in enumerate(kernels):
        ops = k.ops
        if step < len(plan_kernels) and plan_kernels[step].name == k.name:
            ops = [_body_op(node, compiled.plan) for node in plan_kernels[step].body]
        cells = [
            (step, str(step)), (None, _e(k.name)), (None, _e(k.kind)),
            (None, _e("+".join(ops))), (None, f'<span class="nowrap" title="{_e(k.output)}">'
                                              f"{_e(_clean(k.output, 36))}</span>"),
            (None, f'<span class="nowrap">{_e(_dims(k.shape))} {_e(k.dtype)}</span>'),
            (k.launch_us, f"{k.launch_us:,.2f}"),
            (k.read_bytes, _bytes(k.read_bytes)), (k.write_bytes, _bytes(k.write_bytes)),
            (k.flops, _si(k.flops)), (k.predicted_us, f"{k.predicted_us:,.2f}"),
            (k.predicted_us / total_us,
             _bar(k.predicted_us / total_us) + f"{100 * k.predicted_us / total_us:.1f}%"),
        ]
        if energy:
            cells.append((k.energy_uj or 0.0,
                          "" if k.energy_uj is None else f"{k.energy_uj:,.2f}"))
        row = "".join(_td(value, text, name in numeric) for (value, text), name in zip(cells, head))
        kind = f' class="{_e(k.kind)}"'
        rows.append(f'<tr id="kernel-{step}"{kind}>{row}</tr>')
    total = [
        "", "total", "", "", "", "", f"{sum(k.launch_us for k in kernels):,.2f}",
        _bytes(sum(k.read_bytes for k in kernels)), _bytes(sum(k.write_bytes for k in kernels)),
        _si(sum(k.flops for k in kernels)), f"{sum(k.predicted_us for k in kernels):,.2f}", "",
    ] + ([f"{sum(k.energy_uj or 0.0 for k in kernels):,.2f}"] if energy else [])
    foot = "".join(f'<td class="num">{t}</td>' if name in numeric else f"<td>{t}</td>"
                   for t, name in zip(total, head))
    header = "".join(f'<th class="{"num" if h in numeric else ""}">{_e(h)}</th>' for h in head)
    note = (f"<p>Predicted under target <b>{_e(report.target)}</b> "
            f"({_e(report.objective)} objective): the program costs "
            f"<b>{report.cost:,.2f} µs</b>"
            + (f" and <b>{report.energy_uj:,.2f} µJ</b>" if report.energy_uj is not None else "")
            + ". A kernel pays its launch, the bytes it reads and writes, and its operations; "
              "views (dashed in the picture) move no data. Click a column to sort.</p>")
    return (note + f'<div class="wide"><table class="sortable kernels"><thead><tr>{header}'
            f"</tr></thead><tbody>{''.join(rows)}</tbody><tfoot><tr>{foot}</tr></tfoot>"
            "</table></div>")


def _td(value: Any, text: str, numeric: bool) -> str:
    if numeric:
        return f'<td class="num" data-sort="{_e(repr(float(value or 0)))}">{text}</td>'
    return f"<td>{text}</td>"


# ---- memory ------------------------------------------------------------------------------------

def _memory(compiled) -> str:
    memory = compiled.program.memory
    plan = compiled.plan
    steps = len(plan.kernels)
    figures = (f"<p>One arena of <b>{_bytes(memory.arena_bytes)}</b> holds every intermediate "
               f"buffer; the most bytes live at once (the lower bound no placement can beat) is "
               f"<b>{_bytes(memory.lower_bound_bytes)}</b>, and giving every buffer its own "
               f"allocation would take <b>{_bytes(memory.separate_bytes)}</b>. Graph outputs "
               f"({len(memory.external)}) belong to the caller and are not in the arena.</p>")
    if not memory.lifetimes:
        return figures + ('<p class="note">No intermediate buffer: every kernel writes a graph '
                          "output or a view.</p>")
    plot = f'<div class="plot" id="memory-plot">{_memory_svg(memory, plan, steps)}</div>'
    rows = []
    order = sorted(memory.lifetimes, key=lambda n: (memory.lifetimes[n][0], memory.offsets[n]))
    for name in order:
        start, end = memory.lifetimes[name]
        kind = ("workspace" if name in memory.workspace.values()
                else "in place" if any(r == name for r in memory.inplace.values()) else "buffer")
        rows.append(f"<tr><td>{_e(_clean(name, 80))}</td><td>{kind}</td>"
                    f'<td class="num" data-sort="{memory.sizes[name]}">'
                    f"{_bytes(memory.sizes[name])}</td>"
                    f'<td class="num" data-sort="{memory.offsets[name]}">'
                    f"{memory.offsets[name]:,}</td>"
                    f'<td class="num" data-sort="{start}">{start}</td>'
                    f'<td class="num" data-sort="{end}">{end}</td></tr>')
    table = ('<details><summary>buffers in the arena</summary><table class="sortable">'
             "<thead><tr><th>storage</th><th>kind</th><th class=\"num\">size</th>"
             "<th class=\"num\">offset (bytes)</th><th class=\"num\">first step</th>"
             "<th class=\"num\">last step</th></tr></thead>"
             f"<tbody>{''.join(rows)}</tbody></table></details>")
    return figures + plot + table


def _memory_svg(memory, plan, steps: int) -> str:
    import matplotlib
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    scale, unit = _unit(max(memory.arena_bytes, 1))
    width = min(14.0, max(7.0, 0.25 * steps + 4))
    with matplotlib.rc_context({"svg.fonttype": "path", "svg.hashsalt": "eqsat-fuse",
                                "font.size": 9}):
        fig = Figure(figsize=(width, 6.2), layout="constrained")
        top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=[3, 1.4])
        colors = matplotlib.colormaps["tab20"]
        workspaces = set(memory.workspace.values())
        order = sorted(memory.lifetimes, key=lambda n: (memory.lifetimes[n][0], n))
        for i, name in enumerate(order):
            start, end = memory.lifetimes[name]
            is_workspace = name in workspaces
            top.add_patch(Rectangle(
                (start - 0.45, memory.offsets[name] / scale), end - start + 0.9,
                max(memory.sizes[name], 1) / scale,
                facecolor="#dddddd" if is_workspace else colors(i % 20),
                edgecolor="#333333", linewidth=0.5, hatch="///" if is_workspace else None))
        top.axhline(memory.arena_bytes / scale, color="#b22222", linestyle="--", linewidth=1,
                    label=f"arena {_bytes(memory.arena_bytes)}")
        top.set_xlim(-0.7, steps - 0.3)
        top.set_ylim(0, memory.arena_bytes / scale * 1.08)
        top.set_ylabel(f"arena offset ({unit})")
        top.set_title("buffers over kernel steps (hatched: a kernel's scratch workspace)",
                      loc="left")
        top.legend(loc="upper right")

        live = [0] * steps
        for name, (start, end) in memory.lifetimes.items():
            for step in range(start, min(end, steps - 1) + 1):
                live[step] += memory.sizes[name]
        bottom.step(range(steps), [b / scale for b in live], where="mid", color="#1f4e79",
                    linewidth=1.5, label="live bytes")
        bottom.fill_between(range(steps), [b / scale for b in live], step="mid",
                            color="#1f4e79", alpha=0.15)
        bottom.axhline(memory.lower_bound_bytes / scale, color="#2e7d32", linestyle=":",
                       linewidth=1.2, label=f"lower bound {_bytes(memory.lower_bound_bytes)}")
        bottom.axhline(memory.arena_bytes / scale, color="#b22222", linestyle="--",
                       linewidth=1, label=f"arena {_bytes(memory.arena_bytes)}")
        bottom.set_ylim(0, memory.arena_bytes / scale * 1.25)
        bottom.set_ylabel(unit)
        bottom.set_xlabel("kernel step")
        bottom.legend(loc="upper right", fontsize=8)
        if steps <= 48:
            bottom.set_xticks(range(steps))
            bottom.set_xticklabels([_clean(k.name, 12) for k in plan.kernels], rotation=90,
                                   fontsize=7)
        buffer = io.StringIO()
        fig.savefig(buffer, format="svg", metadata={"Date": None})
    svg = buffer.getvalue()
    return svg[svg.index("<svg"):]


# ---- saturation --------------------------------------------------------------------------------

def _saturation(report) -> str:
    facts = [
        ("stop reason", report.stop_reason),
        ("iterations", str(report.iterations)),
        ("e-graph size", f"{report.egraph_nodes:,} e-nodes"),
        ("rules that matched", str(sum(1 for v in report.matches_per_rule.values() if v))),
        ("rules that shaped the program", str(len(report.rules_in_program))),
        ("extractor", report.extractor + "".join(
            f", {k} {_fmt(v)}" for k, v in sorted(report.extraction.items()))),
    ]
    facts_html = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in facts)
    total = sum(report.timings.values()) or 1.0
    timing_rows = "".join(
        f"<tr><td>{_e(stage)}</td><td class=\"num\">{seconds:.3f}</td>"
        f'<td class="num">{_bar(seconds / total)}{100 * seconds / total:.0f}%</td></tr>'
        for stage, seconds in report.timings.items())
    timings = ('<table class="timings"><thead><tr><th>stage</th><th class="num">seconds</th>'
               f'<th class="num">share</th></tr></thead><tbody>{timing_rows}</tbody></table>')
    rules = sorted(set(report.matches_per_rule) | set(report.rules_in_program),
                   key=lambda r: (-report.matches_per_rule.get(r, 0), r))
    most = max(report.matches_per_rule.values(), default=0) or 1
    rule_rows = []
    for rule in rules:
        matches = report.matches_per_rule.get(rule, 0)
        shaped = report.rules_in_program.get(rule, 0)
        rule_rows.append(
            f'<tr class="{"shaped" if shaped else ""}"><td>{_e(rule)}</td>'
            f'<td class="num" data-sort="{matches}">{_bar(matches / most)}{matches:,}</td>'
            f'<td class="num" data-sort="{shaped}">{shaped or ""}</td></tr>')
    rule_table = ('<table class="sortable rules"><thead><tr><th>rule</th>'
                  '<th class="num">matches (e-graph)</th>'
                  '<th class="num">places in the program</th></tr></thead>'
                  f"<tbody>{''.join(rule_rows)}</tbody></table>")
    return (f'<div class="columns"><div><table class="facts">{facts_html}</table>'
            f"<h3>Time per stage</h3>{timings}{_iteration_table(report)}</div>"
            f"<div><h3>Rules</h3><p>How often each rule matched while the e-graph grew, and "
            f"in how many places of the extracted program its result appears (highlighted: "
            f"the rules that shaped the program).</p>{rule_table}</div></div>")


def _iteration_table(report) -> str:
    """One row per saturation iteration (one per round for the `passes` strategy)."""
    records = report.saturation_iterations
    if not records:
        return ""
    rows = "".join(
        f'<tr><td class="num">{r["iteration"]}</td><td class="num">{r["rules_matched"]}</td>'
        f'<td class="num">{r["matches"]:,}</td><td class="num">{r["egraph_nodes"]:,}</td>'
        f'<td class="num">{r["seconds"]:.3f}</td></tr>' for r in records)
    return ('<h3>Iterations</h3><table class="timings"><thead><tr><th class="num">#</th>'
            '<th class="num">rules matched</th><th class="num">matches</th>'
            '<th class="num">e-nodes after</th><th class="num">seconds</th></tr></thead>'
            f"<tbody>{rows}</tbody></table>")


# ---- formatting --------------------------------------------------------------------------------

def _bar(fraction: float, width: int = 60) -> str:
    """A horizontal bar of `fraction` of `width` pixels, to read a column at a glance."""
    pixels = max(0.0, min(1.0, fraction)) * width
    return f'<span class="bar" style="width:{pixels:.0f}px"></span>'


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def _unit(n: float) -> tuple[float, str]:
    for scale, unit in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if n >= scale:
            return float(scale), unit
    return 1.0, "bytes"


def _bytes(n: float) -> str:
    scale, unit = _unit(n)
    return f"{int(n)} B" if scale == 1.0 else f"{n / scale:,.1f} {unit}"


def _si(n: float) -> str:
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= scale:
            return f"{n / scale:,.2f} {prefix}"
    return f"{n:,.0f}"


def _version() -> str:
    from .. import __version__

    return __version__


_CSS = """
:root { --ink: #1d2330; --muted: #5b6475; --line: #d8dde6; --accent: #1f4e79; }
* { box-sizing: border-box; }
body { margin: 0; padding: 12px 20px 40px; color: var(--ink); background: #fff;
       font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; }
h1 { font-size: 20px; margin: 4px 0 8px; } h2 { font-size: 17px; margin: 28px 0 8px;
     border-bottom: 1px solid var(--line); padding-bottom: 4px; } h3 { font-size: 15px; }
.model { font-family: ui-monospace, Menlo, Consolas, monospace; }
nav { margin: 6px 0; } a { color: var(--accent); }
table { border-collapse: collapse; font-size: 13px; }
th, td { border-bottom: 1px solid var(--line); padding: 3px 8px; text-align: left;
         vertical-align: top; }
th { background: #f4f6fa; } .facts th { background: none; color: var(--muted);
     font-weight: normal; padding-left: 0; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
table.sortable th { cursor: pointer; user-select: none; }
tfoot td { font-weight: bold; border-top: 2px solid var(--line); }
tr.alias td { color: var(--muted); } tr.shaped td:first-child { font-weight: bold; }
tr:target td { background: #fff3b0; }
.bar { display: inline-block; height: 9px; background: #9db7d5; margin-right: 4px;
       vertical-align: middle; }
.graphs { display: grid; grid-template-columns: repeat(auto-fit, minmax(420px, 1fr)); gap: 16px; }
figure { margin: 0; border: 1px solid var(--line); border-radius: 6px; padding: 8px;
         min-width: 0; }
figcaption { color: var(--muted); font-size: 13px; margin-bottom: 6px; }
.picture { overflow: auto; max-height: 900px; cursor: grab; }
.picture.dragging { cursor: grabbing; user-select: none; }
.picture svg { display: block; margin: 0 auto; }
.picture.fit svg { max-width: 100%; height: auto; }
figcaption button { font: inherit; font-size: 12px; margin-left: 6px; cursor: pointer; }
.wide { overflow-x: auto; } .nowrap { white-space: nowrap; }
.plot svg { max-width: 100%; height: auto; }
.columns { display: grid; grid-template-columns: minmax(300px, 1fr) 2fr; gap: 24px; }
.note { color: var(--muted); font-style: italic; }
pre { background: #f6f8fa; padding: 8px; overflow: auto; font-size: 12px; }
footer { margin-top: 32px; color: var(--muted); font-size: 12px; }
"""

# Sorting by a click on a column head, and a graph shrunk to its box's width (at first) or
# shown at its actual size; the page's policy allows this script by its hash only.
_SCRIPT = """
// Zoom (wheel, at the pointer) and pan (drag) in each picture. A picture whose fitted size
// would shrink its text below legibility starts at its actual size instead.
document.querySelectorAll(".picture").forEach(function (picture) {
  var svg = picture.querySelector("svg");
  if (!svg || !svg.viewBox.baseVal) { return; }
  var natural = svg.viewBox.baseVal.width * 4 / 3;          // dot's points, in CSS pixels
  var button = picture.closest("figure").querySelector("button.fit-toggle");
  function zoomTo(width, x, y) {
    var old = svg.getBoundingClientRect(), box = picture.getBoundingClientRect();
    var px = x === undefined ? box.width / 2 : x - box.left;
    var py = y === undefined ? box.height / 2 : y - box.top;
    var fx = (picture.scrollLeft + px) / old.width, fy = (picture.scrollTop + py) / old.height;
    picture.classList.remove("fit");
    if (button) { button.textContent = "fit to width"; }
    svg.style.width = width + "px";
    svg.style.height = "auto";
    var now = svg.getBoundingClientRect();
    picture.scrollLeft = fx * now.width - px;
    picture.scrollTop = fy * now.height - py;
  }
  picture.zoomTo = zoomTo;
  if (natural > 0 && picture.clientWidth / natural < 0.45) {
    zoomTo(natural * 0.75);              // 10 px text; start where the graph starts
    var first = svg.querySelector("g.node"), box = picture.getBoundingClientRect();
    if (first) {
      var at = first.getBoundingClientRect();
      picture.scrollTop += at.top - box.top - 8;
      picture.scrollLeft += (at.left + at.right) / 2 - (box.left + box.right) / 2;
    }
  }
  picture.addEventListener("wheel", function (event) {
    event.preventDefault();
    var width = svg.getBoundingClientRect().width * (event.deltaY < 0 ? 1.25 : 0.8);
    zoomTo(Math.max(100, Math.min(width, natural * 4)), event.clientX, event.clientY);
  }, {passive: false});
  var start = null;
  picture.addEventListener("mousedown", function (event) {
    start = [event.clientX, event.clientY, picture.scrollLeft, picture.scrollTop];
    picture.classList.add("dragging");
  });
  window.addEventListener("mousemove", function (event) {
    if (!start) { return; }
    picture.scrollLeft = start[2] - (event.clientX - start[0]);
    picture.scrollTop = start[3] - (event.clientY - start[1]);
  });
  window.addEventListener("mouseup", function () {
    start = null;
    picture.classList.remove("dragging");
  });
});
document.querySelectorAll("button.fit-toggle").forEach(function (button) {
  button.addEventListener("click", function () {
    var picture = button.closest("figure").querySelector(".picture");
    var fit = picture.classList.toggle("fit");
    var svg = picture.querySelector("svg");
    if (svg) { svg.style.width = ""; svg.style.height = ""; }   // undo a zoom
    button.textContent = fit ? "actual size" : "fit to width";
    picture.scrollLeft = (picture.scrollWidth - picture.clientWidth) / 2;
  });
});
document.querySelectorAll("table.sortable").forEach(function (table) {
  table.querySelectorAll("thead th").forEach(function (th, column) {
    th.addEventListener("click", function () {
      var body = table.tBodies[0], rows = Array.from(body.rows);
      var down = th.dataset.order !== "down";
      th.dataset.order = down ? "down" : "up";
      function key(row) {
        var cell = row.cells[column];
        return cell.dataset.sort !== undefined ? parseFloat(cell.dataset.sort) : cell.textContent;
      }
      rows.sort(function (a, b) {
        var x = key(a), y = key(b), c = x < y ? -1 : x > y ? 1 : 0;
        return down ? -c : c;
      });
      rows.forEach(function (row) { body.appendChild(row); });
    });
  });
});
"""
