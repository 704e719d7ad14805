"""The HTML report: one self-contained page a person opens in a browser and sees both graphs.

The page is rendered by headless Chromium, as a reader's browser would: `--dump-dom` gives the
document after parsing (both SVG pictures with the model's op names and the kernels' labels), and
a screenshot at the same window size must show ink where the page says the pictures are. A probe
script, allowed by adding its hash to the page's Content-Security-Policy in a copy of the page,
writes the pictures' on-screen rectangles into the DOM; the test crops those rectangles out of the
screenshot and checks that they hold drawn nodes, edges and text, not blank space.

Chromium (Debian: `chromium`) and Graphviz's `dot` (Debian: `graphviz`) are system packages that
.ci/run installs; on a machine without them these tests skip and say why, except under CI, where
a missing one fails the run (a green CI must not hide a missing install step).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import eqsat_fuse as ef
from eqsat_fuse import cli
from eqsat_fuse.tools import html_report
from eqsat_fuse.demo import demo_model

from conftest import conv_bn_relu_model, make_model

WINDOW = (1400, 1800)       # CSS pixels; the graphs sit in the first screen of the page


def _needs(what: str, found: bool, install: str) -> None:
    if found:
        return
    message = f"{what} is not installed ({install}); .ci/run installs it"
    if os.environ.get("CI"):
        pytest.fail(message + ", but it is missing under CI")
    pytest.skip(message)


def _requirements() -> None:
    _needs("Graphviz's dot", shutil.which("dot") is not None, "apt-get install graphviz")
    for module in ("graphviz", "matplotlib"):
        try:
            __import__(module)
        except ImportError:
            _needs(f"the Python package {module}", False, f"pip install {module}")


def _chromium() -> str:
    _requirements()
    found = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")
                  if shutil.which(n)), None)
    _needs("Chromium", found is not None, "apt-get install chromium")
    return found


def _browse(page: Path, tmp: Path, *extra: str) -> subprocess.CompletedProcess:
    """Headless Chromium on a local file, offline, as root, at a fixed window and scale."""
    command = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
               "--no-first-run", "--disable-background-networking",
               "--disable-component-update", "--disable-sync", f"--user-data-dir={tmp / 'chrome'}",
               "--hide-scrollbars", "--force-device-scale-factor=1",
               f"--window-size={WINDOW[0]},{WINDOW[1]}", *extra, page.resolve().as_uri()]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=tmp)
    assert result.returncode == 0, result.stderr[-2000:]
    return result


class _Page(HTMLParser):
    """What a dumped DOM holds: tags by name, and the SVG text of each figure by its id."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags: dict[str, int] = {}
        self.figure_text: dict[str, list[str]] = {}
        self.figure_svgs: dict[str, int] = {}
        self.text: list[str] = []
        self._figure: str | None = None
        self._in_text = False

    def handle_starttag(self, tag, attrs):
        self.tags[tag] = self.tags.get(tag, 0) + 1
        attrs = dict(attrs)
        if tag == "figure":
            self._figure = attrs.get("id")
            self.figure_text[self._figure] = []
            self.figure_svgs[self._figure] = 0
        elif tag == "svg" and self._figure:
            self.figure_svgs[self._figure] += 1
        elif tag == "text":
            self._in_text = True

    def handle_endtag(self, tag):
        if tag == "figure":
            self._figure = None
        elif tag == "text":
            self._in_text = False

    def handle_data(self, data):
        self.text.append(data)
        if self._in_text and self._figure:
            self.figure_text[self._figure].append(data)


def _parse(markup: str) -> _Page:
    page = _Page()
    page.feed(markup)
    return page


_PROBE = """
window.addEventListener("load", function () {
  function visible(id) {
    var box = document.querySelector("#" + id + " .picture");
    var svg = box.querySelector("svg");
    var a = box.getBoundingClientRect(), b = svg.getBoundingClientRect();
    return [Math.max(a.left, b.left), Math.max(a.top, b.top),
            Math.min(a.right, b.right), Math.min(a.bottom, b.bottom)];
  }
  var probe = {original: visible("original-graph"), fused: visible("fused-graph"),
               width: window.innerWidth};
  // the page's own script runs (its hash is the one the policy allows): toggle, then sort
  document.querySelector("#original-graph button.fit-toggle").click();
  probe.toggled = !document.querySelector("#original-graph .picture").classList.contains("fit");
  document.querySelector("#original-graph button.fit-toggle").click();
  var heads = Array.from(document.querySelectorAll("table.kernels thead th"));
  heads.find(function (th) { return th.textContent === "predicted µs"; }).click();
  probe.first_row = document.querySelector("table.kernels tbody tr").id;
  document.documentElement.setAttribute("data-probe", JSON.stringify(probe));
});
""".strip()


def _with_probe(report: Path, out: Path, probe: str = _PROBE) -> Path:
    """A copy of the report with a probe script, allowed by its hash in the page's policy."""
    text = report.read_text(encoding="utf-8")
    digest = base64.b64encode(hashlib.sha256(probe.encode()).digest()).decode()
    text, n = re.subn(r"script-src ('sha256-[^']+')", rf"script-src \1 'sha256-{digest}'", text)
    assert n == 1, "the page has no script-src policy"
    text = text.replace("</body>", f"<script>{probe}</script>\n</body>")
    out.write_text(text, encoding="utf-8")
    return out


# ---- fixtures ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    _requirements()
    compiled = ef.compile(demo_model())
    path = tmp_path_factory.mktemp("report") / "demo.html"
    html_report.write(compiled, path)
    return compiled, path


HOSTILE_NODE = "<script>alert(1)</script>"
HOSTILE_INPUT = 'x"><img src=x onerror=alert(2)>'
HOSTILE_OUTPUT = "</svg><script>alert(3)</script>&amp;\\N"


def hostile_model() -> onnx.ModelProto:
    """Names that would be markup or Graphviz escapes if they were pasted in unescaped."""
    weight = numpy_helper.from_array(np.eye(4, dtype=np.float32), "w&<b>")
    nodes = [helper.make_node("MatMul", [HOSTILE_INPUT, "w&<b>"], ["m<i>"], name=HOSTILE_NODE),
             helper.make_node("Relu", ["m<i>"], [HOSTILE_OUTPUT], name='relu\\l"q"<>')]
    graph = helper.make_graph(
        nodes, "<b>graph</b>",
        [helper.make_tensor_value_info(HOSTILE_INPUT, TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info(HOSTILE_OUTPUT, TensorProto.FLOAT, [2, 4])], [weight])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


# ---- the page, as text -------------------------------------------------------------------------

def test_report_is_one_self_contained_file(demo):
    compiled, path = demo
    text = path.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>")
    # nothing is fetched: every link is in-page, every image inline, no external style or script
    for attr in re.findall(r'\b(?:src|href)\s*=\s*"([^"]*)"', text):
        assert attr.startswith(("#", "data:")), attr
    assert "<link" not in text and "@import" not in text and "<img" not in text
    assert not re.search(r"url\((?!#)", text)
    policy = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', text).group(1)
    assert "default-src 'none'" in policy and "unsafe-inline" not in policy.split("script-src")[1]
    # both graphs, the memory plot, the kernel table and the rule table
    assert text.count("<svg") == 3
    assert 'id="original-graph"' in text and 'id="fused-graph"' in text
    assert 'id="memory-plot"' in text
    for step, kernel in enumerate(compiled.report.kernels):
        assert f'id="kernel-{step}"' in text
    assert "fuse-relu" in text and compiled.report.stop_reason in text


def test_kernel_table_gives_the_predicted_cost_breakdown(demo):
    compiled, path = demo
    page = _parse(path.read_text(encoding="utf-8"))
    text = " ".join(page.text)
    for head in ("launch µs", "read", "written", "FLOPs", "predicted µs", "energy µJ"):
        assert head in text
    assert f"{compiled.report.cost:,.2f}" in text           # the program's predicted cost
    heaviest = max(compiled.report.kernels, key=lambda k: k.predicted_us)
    assert f"{heaviest.predicted_us:,.2f}" in text


def test_report_write_refuses_to_overwrite_without_force(demo, tmp_path):
    compiled, _ = demo
    path = tmp_path / "r.html"
    path.write_text("keep me")
    with pytest.raises(ef.EqsatFuseError, match="already exists; pass force=True"):
        compiled.report_html(path)
    assert path.read_text() == "keep me"
    compiled.report_html(path, force=True)
    assert path.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert [p.name for p in tmp_path.iterdir()] == ["r.html"]      # no temporary file left


def test_cli_optimize_writes_the_report(tmp_path, rng, capsys):
    _requirements()
    model = tmp_path / "m.onnx"
    onnx.save(conv_bn_relu_model(rng), model)
    out = tmp_path / "m.html"
    assert cli.main(["optimize", str(model), "--report", str(out), "--quiet"]) == 0
    assert f"wrote the report to {out}" in capsys.readouterr().out
    assert "Conv" in out.read_text(encoding="utf-8")
    # an existing report: refused before compiling, kept as it was; replaced with --force
    out.write_text("old")
    assert cli.main(["optimize", str(model), "--report", str(out), "--quiet"]) == 2
    assert "already exists; pass --force" in capsys.readouterr().err
    assert out.read_text() == "old"
    assert cli.main(["optimize", str(model), "--report", str(out), "--quiet", "--force",
                     "--json"]) == 0
    captured = capsys.readouterr()
    json.loads(captured.out)                        # stdout stays pure JSON
    assert "wrote the report" in captured.err
    # the input model is never the report
    assert cli.main(["optimize", str(model), "--report", str(model), "--quiet", "--force"]) == 2
    assert "refusing to overwrite the input model" in capsys.readouterr().err


def test_missing_graphviz_is_named_before_compiling(tmp_path, rng, capsys, monkeypatch):
    model = tmp_path / "m.onnx"
    onnx.save(conv_bn_relu_model(rng), model)
    monkeypatch.setattr(html_report.shutil, "which", lambda name: None)
    assert cli.main(["optimize", str(model), "--report", str(tmp_path / "m.html")]) == 2
    err = capsys.readouterr().err
    assert "apt-get install graphviz" in err and "[eqsat-fuse] import" not in err
    assert not (tmp_path / "m.html").exists()


def test_names_from_the_model_are_escaped(tmp_path):
    _requirements()
    compiled = ef.compile(hostile_model())
    path = html_report.write(compiled, tmp_path / "hostile.html")
    text = path.read_text(encoding="utf-8")
    assert "alert" in text                           # the names are shown...
    assert "<script>alert" not in text and "<img" not in text   # ...as text, never as markup
    assert text.count("<script") == 1                # the page's own sorting script
    page = _parse(text)
    shown = "".join(page.text)
    assert HOSTILE_NODE in shown and HOSTILE_INPUT in shown
    assert "<script>alert(3)</script>&amp;\\N" in shown     # long names keep their end


# ---- the page, in a browser --------------------------------------------------------------------

def test_chromium_shows_both_graphs(demo, tmp_path):
    compiled, report = demo
    page_file = _with_probe(report, tmp_path / "probed.html")
    dom = _browse(page_file, tmp_path, "--dump-dom").stdout
    page = _parse(dom)

    # both pictures are in the rendered document, with the model's ops and the kernels' labels
    assert page.figure_svgs == {"original-graph": 1, "fused-graph": 1}
    original = set(page.figure_text["original-graph"])
    fused = " | ".join(page.figure_text["fused-graph"])
    source = demo_model()
    assert {n.op_type for n in source.graph.node} <= original
    assert {n.name for n in source.graph.node} <= original
    for kernel in compiled.plan.kernels:
        assert f"{kernel.name}: {kernel.ops[0]}" in fused, kernel.name
    fused_kernels = [k for k in compiled.plan.kernels if len(k.ops) > 2]
    assert fused_kernels                                      # a fused kernel, labelled with its ops
    assert all(f"{k.name}: {'+'.join(k.ops)}" in fused for k in fused_kernels)

    # the screenshot has drawn graphs where the page says the pictures are
    probe = json.loads(re.search(r'data-probe="([^"]+)"', dom).group(1).replace("&quot;", '"'))
    assert probe["width"] == WINDOW[0]         # layout depends on the width only (no vh units)
    assert probe["toggled"]                    # "actual size" un-fits the picture
    costs = [k.predicted_us for k in compiled.report.kernels]
    assert probe["first_row"] == f"kernel-{costs.index(max(costs))}"   # sorted, dearest first
    shot = tmp_path / "shot.png"
    _browse(page_file, tmp_path, f"--screenshot={shot}")
    import matplotlib.image

    pixels = matplotlib.image.imread(shot)[..., :3]
    assert pixels.shape[:2] == (WINDOW[1], WINDOW[0])
    fills = {"original": (0xcf, 0xe0, 0xf7),          # a Conv/MatMul node's fill
             "fused": (0xee, 0xf4, 0xfb)}             # a kernel box's fill
    for name, fill in fills.items():
        left, top, right, bottom = (round(v) for v in probe[name])
        assert right - left > 250 and bottom - top > 400, (name, probe[name])
        assert 0 <= left and right <= WINDOW[0] and 0 <= top and bottom <= WINDOW[1]
        region = pixels[top:bottom, left:right]
        grey = region.mean(axis=2)
        assert (grey < 0.9).mean() > 0.03, f"{name} graph region is nearly blank"
        assert (grey < 0.4).sum() > 2000, f"{name} graph region has no text or edges"
        near = np.abs(region - np.array(fill) / 255).max(axis=2) < 4 / 255
        assert near.sum() > 2000, f"{name} graph region shows no node fill {fill}"
    # and the page around them is not all ink: a blank strip right of the header table
    assert (pixels[20:60, WINDOW[0] - 300:WINDOW[0] - 40].mean(axis=2) > 0.97).all()


def test_chromium_runs_no_script_from_the_model(tmp_path):
    _chromium()
    compiled = ef.compile(hostile_model())
    report = html_report.write(compiled, tmp_path / "hostile.html")
    # a script the policy does not allow (as an injected one would be) does not run either
    text = report.read_text(encoding="utf-8").replace(
        "</body>", '<script>document.documentElement.setAttribute("data-ran", "1")</script></body>')
    page_file = tmp_path / "hostile-injected.html"
    page_file.write_text(text, encoding="utf-8")
    dom = _browse(page_file, tmp_path, "--dump-dom").stdout
    page = _parse(dom)
    assert 'data-ran="1"' not in dom
    assert page.tags.get("img", 0) == 0
    assert page.tags["script"] == 2                  # the page's own, and the blocked one above
    shown = "".join(page.text)
    assert HOSTILE_NODE in shown and HOSTILE_INPUT in shown
    assert HOSTILE_NODE in " ".join(page.figure_text["original-graph"])


# ---- a large model: 2,000 nodes, a third of them shape arithmetic ------------------------------

def large_model(blocks: int) -> onnx.ModelProto:
    """Blocks of Reshape(h, a shape computed from Shape(h)), MatMul, Add, Relu, Mul, Add: nine
    nodes each, three of them shape arithmetic, as exporters write them."""
    inits = {"w": np.full((16, 16), 0.05, np.float32), "b": np.zeros(16, np.float32),
             "zero": np.array([0], np.int64), "minus": np.array([-1], np.int64)}
    nodes, h = [], "x"
    for i in range(blocks):
        p = f"b{i}_"
        nodes += [helper.make_node("Shape", [h], [p + "s"]),
                  helper.make_node("Gather", [p + "s", "zero"], [p + "d"], axis=0),
                  helper.make_node("Concat", [p + "d", "minus"], [p + "c"], axis=0),
                  helper.make_node("Reshape", [h, p + "c"], [p + "r"]),
                  helper.make_node("MatMul", [p + "r", "w"], [p + "m"]),
                  helper.make_node("Add", [p + "m", "b"], [p + "a"]),
                  helper.make_node("Relu", [p + "a"], [p + "y"]),
                  helper.make_node("Mul", [p + "y", p + "y"], [p + "q"]),
                  helper.make_node("Add", [p + "q", p + "y"], [p + "o"])]
        h = p + "o"
    nodes.append(helper.make_node("Identity", [h], ["y"]))
    return make_model(nodes, [("x", [4, 16])], [("y", [4, 16])], inits)


_LARGE_PROBE = """
window.addEventListener("load", function () {
  function legible(id) {       // text drawn inside the visible part of the picture, >= 8 px tall
    var box = document.querySelector("#" + id + " .picture").getBoundingClientRect();
    return Array.from(document.querySelectorAll("#" + id + " svg text")).filter(function (t) {
      var r = t.getBoundingClientRect();
      return r.height >= 8 && r.top >= box.top && r.bottom <= box.bottom && r.left >= box.left
        && r.right <= box.right;
    }).length;
  }
  function region(id) {
    var a = document.querySelector("#" + id + " .picture").getBoundingClientRect();
    return [a.left, a.top, a.right, a.bottom];
  }
  var probe = {original: legible("original-graph"), fused: legible("fused-graph"),
               original_box: region("original-graph"), fused_box: region("fused-graph")};
  var picture = document.querySelector("#original-graph .picture");
  var svg = picture.querySelector("svg"), before = svg.getBoundingClientRect().width;
  var at = picture.getBoundingClientRect();
  picture.dispatchEvent(new WheelEvent("wheel", {deltaY: -100, clientX: at.left + 50,
                                                 clientY: at.top + 50, bubbles: true,
                                                 cancelable: true}));
  probe.zoomed = svg.getBoundingClientRect().width / before;
  var top = picture.scrollTop;
  picture.dispatchEvent(new MouseEvent("mousedown", {clientX: 200, clientY: 900, bubbles: true}));
  window.dispatchEvent(new MouseEvent("mousemove", {clientX: 200, clientY: 600}));
  window.dispatchEvent(new MouseEvent("mouseup", {}));
  probe.panned = picture.scrollTop - top;
  document.documentElement.setAttribute("data-probe", JSON.stringify(probe));
});
""".strip()


def test_a_2000_node_model_s_graphs_are_drawn_collapsed_legible_zoomable(tmp_path):
    _chromium()
    model = large_model(222)
    assert len(model.graph.node) == 1999
    compiled = ef.compile(model)
    report = compiled.report_html(tmp_path / "large.html")
    page = report.read_text(encoding="utf-8")
    assert "too many to draw" not in page
    assert "666 nodes of shape arithmetic folded at compile time" in page
    parsed = _parse(page)
    assert parsed.figure_svgs == {"original-graph": 1, "fused-graph": 1}
    drawn = parsed.figure_text["original-graph"]
    assert "Shape" not in drawn and "Concat" not in drawn and drawn.count("MatMul") == 222

    dom = _browse(_with_probe(report, tmp_path / "probed.html", _LARGE_PROBE), tmp_path,
                  "--dump-dom").stdout
    probe = json.loads(re.search(r'data-probe="([^"]+)"', dom).group(1).replace("&quot;", '"'))
    # on opening, both pictures show many labels at a legible size (not shrunk to fit) ...
    assert probe["original"] >= 12 and probe["fused"] >= 12, probe
    # ... the wheel zooms in at the pointer, and a drag pans
    assert 1.2 < probe["zoomed"] < 1.3, probe
    assert probe["panned"] > 200, probe

    shot = tmp_path / "shot.png"
    _browse(report, tmp_path, f"--screenshot={shot}")
    import matplotlib.image

    pixels = matplotlib.image.imread(shot)[..., :3]
    for name, fill in (("original", (0xcf, 0xe0, 0xf7)), ("fused", (0xee, 0xf4, 0xfb))):
        left, top, right, bottom = (round(v) for v in probe[f"{name}_box"])
        region = pixels[max(top, 0):min(bottom, WINDOW[1]), max(left, 0):min(right, WINDOW[0])]
        assert (region.mean(axis=2) < 0.4).sum() > 800, f"{name}: no text or edges drawn"
        near = np.abs(region - np.array(fill) / 255).max(axis=2) < 4 / 255
        assert near.sum() > 2000, f"{name} graph region shows no node fill {fill}"
