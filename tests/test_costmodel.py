"""Cost-model files: the shipped ones load, and a bad one names the file and the key."""

from __future__ import annotations

import re

import pytest
from onnx import helper

import eqsat_fuse as ef
from eqsat_fuse.extraction.costmodel import load_cost_model
from eqsat_fuse.resources import cost_model_file, targets

from conftest import make_model


def test_every_shipped_target_loads():
    assert {"cpu", "gpu", "edge-npu"} <= set(targets())
    for target in targets():
        model = load_cost_model(target)
        assert model.target == target
        assert model.bytes_us(1e9) > 0
        for objective in ("latency", "energy"):
            prices = model.prices(objective)
            assert prices.launch > 0 and prices.byte > 0


def edited(tmp_path, target, key, new):
    """The shipped file of `target` with the line of `key` (in its table) replaced by `new`."""
    text = cost_model_file(target).read_text()
    table, _, name = key.rpartition(".")
    start = text.index(f"[{table}]")
    end = text.find("\n[", start + 1)
    end = len(text) if end < 0 else end
    section = text[start:end]
    pattern = re.compile(rf"^{re.escape(name)}\s*=\s*(?:\[[^\]]*\]|[^\n]*)", re.M)
    assert pattern.search(section), key
    text = text[:start] + pattern.sub(lambda _: new, section, count=1) + text[end:]
    path = tmp_path / "edited.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("target, key, new, message", [
    ("cpu", "memory.bandwidth_gbs", "", "missing key memory.bandwidth_gbs"),
    ("cpu", "kernel.launch_us", "launch_us = 4.0\nlaunch_ms = 1", "unknown key kernel.launch_ms"),
    ("cpu", "kernel.launch_us", "launch_us = -4.0",
     "kernel.launch_us must be a finite number >= 0"),
    ("cpu", "compute.matmul_gflops", "matmul_gflops = 0",
     "compute.matmul_gflops must be greater than zero"),
    ("cpu", "kernel.launch_us", 'launch_us = "fast"', "kernel.launch_us must be a number"),
    ("cpu", "flops_per_element.Tanh", "Tanhh = 10.0",
     "flops_per_element.Tanhh names no operator"),
    ("cpu", "flops_per_element.Tanh", '"Gelu(approxmate=tanh)" = 10.0',
     "Gelu has no attribute approxmate"),
    ("cpu", "flops_per_element.Tanh", '"Gelus(approximate=tanh)" = 10.0',
     r"names no operator \(Gelus\)"),
    ("cpu", "flops_per_element.Tanh", '"Gelu[tanh]" = 10.0', "names no operator"),
    ("cpu", "fusion.prologue", 'prologue = ["Relu"]', "fusion.prologue lists 'Relu'"),
    ("cpu", "memory.bandwidth_gbs", "bandwidth_gbs = = 18", "not valid TOML"),
    ("cpu", "energy.static_w", "", "missing key energy.static_w"),
    ("cpu", "energy.pj_per_flop", "pj_per_flop = -1", "energy.pj_per_flop must be a finite"),
    ("cpu", "energy.launch_nj", "launch_nj = 1\nlaunch_uj = 1", "unknown key energy.launch_uj"),
    ("cpu", "compute.conv_op_us", "conv_op_us = -2", "compute.conv_op_us must be a finite"),
    ("edge-npu", "memory.onchip_bandwidth_gbs", "",
     "memory.onchip_bytes needs memory.onchip_bandwidth_gbs"),
    ("edge-npu", "memory.onchip_bandwidth_gbs", "onchip_bandwidth_gbs = 1.0",
     "onchip_bandwidth_gbs must be at least"),
    ("edge-npu", "memory.storage_dtype", 'storage_dtype = "int4"',
     "memory.storage_dtype must be one of"),
    ("edge-npu", "energy.onchip_pj_per_byte", "", "missing key energy.onchip_pj_per_byte"),
    ("edge-npu", "energy.onchip_pj_per_byte", "onchip_pj_per_byte = 400.0",
     "onchip_pj_per_byte must not exceed"),
    ("edge-npu", "fusion.epilogue", 'epilogue = ["Conv"]', "fusion.epilogue lists 'Conv'"),
    ("edge-npu", "fusion.epilogue_anchors", 'epilogue_anchors = ["Relu"]',
     "fusion.epilogue_anchors lists 'Relu'"),
    ("edge-npu", "fusion.elementwise", "elementwise = 0", "fusion.elementwise must be true or false"),
    ("cpu", "kernel.launch_us", "launch_us = nan", "kernel.launch_us must be a finite number"),
    ("cpu", "memory.bandwidth_gbs", "bandwidth_gbs = inf", "must be a finite number"),
    ("cpu", "kernel.launch_us", "launch_us = true", "must be a number, not True"),
    ("cpu", "kernel.launch_us", "launch_us = [1, 2]", "must be a number"),
    ("cpu", "compute.matmul_gflops", "matmul_gflops = -0.0", "greater than zero"),
])
def test_bad_cost_file_names_file_line_and_key(tmp_path, target, key, new, message):
    path = edited(tmp_path, target, key, new)
    with pytest.raises(ef.CostModelError, match=message) as info:
        load_cost_model(path)
    where = re.match(rf"{re.escape(str(path))}:(\d+)(:\d+)?: ", str(info.value))
    assert where, str(info.value)
    line = path.read_text().splitlines()[int(where[1]) - 1]
    named = re.search(r"(\w+)\.(\w+)", message)      # the line holds the key, or its [table]
    if named:
        assert named[2] in line or f"[{named[1]}]" in line, (str(info.value), line)
    else:
        assert new.splitlines()[0] == line


def test_a_bad_value_is_named_at_its_line(tmp_path):
    path = edited(tmp_path, "cpu", "kernel.launch_us", "launch_us = -4.0")
    number = path.read_text().splitlines().index("launch_us = -4.0") + 1
    with pytest.raises(ef.CostModelError) as info:
        load_cost_model(path)
    assert str(info.value).startswith(f"{path}:{number}: kernel.launch_us must be a finite")


def test_unknown_table_is_named(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text(cost_model_file("cpu").read_text().replace("[fusion]", "[fusoin]"))
    with pytest.raises(ef.CostModelError, match="unknown table \\[fusoin\\]"):
        load_cost_model(path)


def test_energy_table_is_optional_but_the_energy_objective_needs_it(tmp_path):
    text = cost_model_file("gpu").read_text()
    path = tmp_path / "noenergy.toml"
    path.write_text(text[:text.index("[energy]")])
    model = load_cost_model(path)
    assert not model.has_energy()
    model.prices("latency")
    with pytest.raises(ef.CostModelError, match="needs an \\[energy\\] table"):
        model.prices("energy")


def test_unknown_target_lists_the_shipped_ones():
    with pytest.raises(ef.CostModelError, match="unknown target 'tpu'.*cpu"):
        load_cost_model("tpu")


def test_unknown_objective_is_refused():
    with pytest.raises(ef.CostModelError, match="unknown objective 'speed'"):
        load_cost_model("cpu").prices("speed")


def test_prices_follow_the_file():
    model = load_cost_model("edge-npu")
    latency, energy = model.prices("latency"), model.prices("energy")
    assert latency.launch == model.launch_us
    assert latency.byte == pytest.approx(1 / (model.bandwidth_gbs * 1e3))
    assert latency.onchip_byte == pytest.approx(1 / (model.onchip_bandwidth_gbs * 1e3))
    flops = 1e6
    assert latency.work(flops, "Conv") == pytest.approx(flops / (model.rates_gflops["conv"] * 1e3))
    e = model.energy
    assert energy.launch == pytest.approx(e["launch_nj"] * 1e-3 + e["static_w"] * model.launch_us)
    assert energy.byte == pytest.approx(e["dram_pj_per_byte"] * 1e-6
                                        + e["static_w"] * latency.byte)
    # a working set that fits the SRAM pays its rates; one that does not pays DRAM's
    fits, spills = model.onchip_bytes, model.onchip_bytes + 1
    assert latency.bytes_cost(fits) == pytest.approx(fits * latency.onchip_byte)
    assert latency.bytes_cost(spills) == pytest.approx(spills * latency.byte)


def test_per_class_operation_costs_default_to_op_us(tmp_path):
    model = load_cost_model("gpu")
    assert all(v == model.op_us for v in model.prices("latency").op.values())
    path = tmp_path / "ops.toml"
    text = cost_model_file("gpu").read_text()
    path.write_text(text.replace("[compute]", "[compute]\nconv_op_us = 7.0\nconv_group_us = 0.5"))
    model = load_cost_model(path)
    prices = model.prices("latency")
    assert prices.op["conv"] == 7.0 and prices.op["matmul"] == model.op_us
    assert prices.work(0.0, "Conv", groups=3) == pytest.approx(7.0 + 2 * 0.5)


def test_a_target_names_its_own_rule_files_in_its_cost_file(tmp_path):
    npu = load_cost_model("edge-npu")
    assert [p.rsplit("/", 1)[-1] for p in npu.rule_files] == ["edge-npu.egg"]
    assert load_cost_model("cpu").rule_files == () == load_cost_model("gpu").rule_files
    # a user's target with a rule file of its own: loaded (and checked like any user rule file)
    (tmp_path / "mine.egg").write_text(
        '(ruleset mine)\n(rewrite (Neg (Neg x)) x :ruleset mine :name "mine-double-neg")\n')
    path = edited(tmp_path, "cpu", "target.name", 'name = "mine"\nrules = ["mine.egg"]')
    model = ef.compile(_double_neg_model(), target=str(path))
    assert model.report.matches_per_rule.get("mine-double-neg", 0) >= 1
    assert "npu-relu-before-maxpool" not in model.report.rulesets


def test_a_rule_file_the_cost_file_cannot_find_is_named_at_its_line(tmp_path):
    path = edited(tmp_path, "edge-npu", "target.rules", 'rules = ["targets/nope.egg"]')
    with pytest.raises(ef.CostModelError, match=r"edited\.toml:\d+: target.rules names "
                                                r"'targets/nope.egg', which is not a rule file"):
        load_cost_model(path)
    path = edited(tmp_path, "edge-npu", "target.rules", "rules = [3]")
    with pytest.raises(ef.CostModelError, match=r"target.rules must be a list of file names"):
        load_cost_model(path)


def _double_neg_model():
    nodes = [helper.make_node("Neg", ["x"], ["n"]), helper.make_node("Neg", ["n"], ["y"])]
    return make_model(nodes, [("x", [2, 3])], [("y", [2, 3])])


def test_a_pooling_window_larger_than_its_input_costs_what_it_reads():
    """HF EfficientNet's pooler: AveragePool with a 640x640 window over a 3x3 input reads 9
    cells per output, and is predicted as cheap as a GlobalAveragePool, not 262 MFLOP."""
    def pooled(kernel):
        node = helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=kernel,
                                pads=[0, 0, kernel[0] - 3, kernel[1] - 3], ceil_mode=1)
        model = make_model([node], [("x", [1, 640, 3, 3])], [("y", [1, 640, 1, 1])])
        return ef.compile(model).report.kernels[0]

    huge, exact = pooled([640, 640]), pooled([3, 3])
    assert huge.flops == exact.flops == 640 * 9
    assert huge.predicted_us == pytest.approx(exact.predicted_us)


def test_a_form_of_an_op_is_priced_apart(tmp_path):
    """`Op(attr=value)` prices the nodes whose attribute has that value; the others keep the
    op's price (the two Gelu forms run at different speeds on every backend)."""
    text = re.sub(r'^"?Gelu[^=]*=.*$', "", cost_model_file("cpu").read_text(), flags=re.M)
    path = tmp_path / "forms.toml"
    path.write_text(text.replace("[flops_per_element]\n", '[flops_per_element]\nGelu = 10.0\n'
                                 '"Gelu(approximate=tanh)" = 30.0\n'))
    flops = {}
    for form in ("none", "tanh"):
        node = helper.make_node("Gelu", ["x"], ["y"], approximate=form)
        model = make_model([node], [("x", [4, 256])], [("y", [4, 256])], opset=20)
        kernel, = ef.compile(model, target=str(path)).report.kernels
        flops[form] = kernel.flops
    assert flops == {"none": 10.0 * 1024, "tanh": 30.0 * 1024}


def _conv_model(channels: int, size: int, stride: int, group: int, tail: list[str]):
    """x -> Conv (3x3, `group` groups, weights as initializers) -> `tail` elementwise ops."""
    import numpy as np
    w = np.ones((channels, channels // group, 3, 3), np.float32)
    names = ["c", *[f"t{i}" for i in range(len(tail))]]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1],
                              strides=[stride, stride], group=group)]
    nodes += [helper.make_node(op, [names[i]], [names[i + 1]]) for i, op in enumerate(tail)]
    out = -(-size // stride)
    return make_model(nodes, [("x", [1, channels, size, size])],
                      [(names[-1], [1, channels, out, out])], {"w": w})


def _one_kernel(model, target):
    kernel, = ef.compile(model, target=str(target), backend="numpy").report.kernels
    return kernel


def _cpu_without_and_with(tmp_path, key: str, value: float):
    """The shipped cpu.toml without `key`, and with `key = value`: two cost files."""
    text = cost_model_file("cpu").read_text()
    without, with_ = tmp_path / f"no-{key}.toml", tmp_path / f"{key}.toml"
    without.write_text(re.sub(rf"^{key} = .*$", "", text, flags=re.M))
    with_.write_text(re.sub(rf"^{key} = .*$", f"{key} = {value}", text, flags=re.M))
    return without, with_


def test_a_depthwise_convolution_pays_for_reordering_its_input(tmp_path):
    """depthwise_input_gbs charges a depthwise Conv per byte of its input (a stride-2 one reads
    four inputs an output); a dense Conv of the same shape is not charged."""
    plain, slow = _cpu_without_and_with(tmp_path, "depthwise_input_gbs", 1.0)
    input_bytes = 4 * 32 * 28 * 28
    for stride in (1, 2):
        depthwise = _conv_model(32, 28, stride, 32, [])
        extra = (_one_kernel(depthwise, slow).predicted_us
                 - _one_kernel(depthwise, plain).predicted_us)
        assert extra == pytest.approx(input_bytes / 1e3, rel=1e-6)     # 1 GB/s: 1e3 bytes/us
    dense = _conv_model(32, 28, 2, 1, [])
    assert _one_kernel(dense, slow).predicted_us == pytest.approx(
        _one_kernel(dense, plain).predicted_us)


def test_an_epilogue_pays_one_pass_over_the_contractions_output(tmp_path):
    """epilogue_pass_gbs: a Conv's epilogue (Relu, then Neg) costs one pass over the output,
    read and written, whatever the number of its ops; a Conv alone, a Conv whose Relu runs as
    a kernel of its own, and an elementwise kernel pay none."""
    none_, slow = _cpu_without_and_with(tmp_path, "epilogue_pass_gbs", 100.0)
    out_bytes = 4 * 8 * 16 * 16
    for tail in (["Relu"], ["Relu", "Neg"]):
        model = _conv_model(8, 16, 1, 1, tail)
        kernel = _one_kernel(model, slow)
        assert kernel.ops == ["Conv", *tail]
        assert kernel.predicted_us - _one_kernel(model, none_).predicted_us == pytest.approx(
            2 * out_bytes / 100e3, rel=1e-6)
    alone = _conv_model(8, 16, 1, 1, [])
    assert _one_kernel(alone, slow).predicted_us == pytest.approx(
        _one_kernel(alone, none_).predicted_us)

    def unfused(path):    # the same target with no epilogue on a Conv
        text = path.read_text().replace("[fusion]\n", '[fusion]\nepilogue_anchors = ["MatMul"]\n')
        out = tmp_path / f"unfused-{path.name}"
        out.write_text(text)
        kernels = ef.compile(_conv_model(8, 16, 1, 1, ["Relu"]), target=str(out),
                             backend="numpy").report.kernels
        assert [k.ops for k in kernels] == [["Conv"], ["Relu"]]
        return sum(k.predicted_us for k in kernels)
    assert unfused(slow) == pytest.approx(unfused(none_))
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Neg", ["r"], ["y"])]
    chain = make_model(nodes, [("x", [8, 256])], [("y", [8, 256])])
    assert _one_kernel(chain, slow).predicted_us == pytest.approx(
        _one_kernel(chain, none_).predicted_us)
    _, bad = _cpu_without_and_with(tmp_path, "epilogue_pass_gbs", 0)
    with pytest.raises(ef.CostModelError, match="memory.epilogue_pass_gbs must be greater"):
        load_cost_model(bad)
