"""Cost-model files: the shipped ones load, and a bad one names the file and the key."""

from __future__ import annotations

import pytest

import eqsat_fuse as ef
from eqsat_fuse.costmodel import load_cost_model
from eqsat_fuse.resources import cost_model_file, targets


def test_every_shipped_target_loads():
    assert "cpu" in targets()
    for target in targets():
        model = load_cost_model(target)
        assert model.target == target
        assert model.bytes_us(1e9) > 0


def edited(tmp_path, old, new):
    text = cost_model_file("cpu").read_text()
    assert old in text
    path = tmp_path / "edited.toml"
    path.write_text(text.replace(old, new))
    return path


@pytest.mark.parametrize("old, new, message", [
    ("bandwidth_gbs = 18.0", "", "missing key memory.bandwidth_gbs"),
    ("launch_us = 4.0", "launch_us = 4.0\nlaunch_ms = 1", "unknown key kernel.launch_ms"),
    ("launch_us = 4.0", "launch_us = -4.0", "kernel.launch_us must be a finite number >= 0"),
    ("matmul_gflops = 80.0", "matmul_gflops = 0", "compute.matmul_gflops must be greater than zero"),
    ("launch_us = 4.0", 'launch_us = "fast"', "kernel.launch_us must be a number"),
    ("[fusion]", "[fusoin]", "unknown table \\[fusoin\\]"),
    ("Tanh = 10.0", "Tanhh = 10.0", "flops_per_element.Tanhh names no operator"),
    ('prologue = ["Softmax",', 'prologue = ["Relu",', "fusion.prologue lists 'Relu'"),
    ("bandwidth_gbs = 18.0", "bandwidth_gbs = = 18", "not valid TOML"),
])
def test_bad_cost_file_names_file_and_key(tmp_path, old, new, message):
    path = edited(tmp_path, old, new)
    with pytest.raises(ef.CostModelError, match=message) as info:
        load_cost_model(path)
    assert str(path) in str(info.value)


def test_unknown_target_lists_the_shipped_ones():
    with pytest.raises(ef.CostModelError, match="unknown target 'tpu'.*cpu"):
        load_cost_model("tpu")
