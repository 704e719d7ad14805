"""rules/generated.egg follows from the operator table: up to date, complete, and the same
fusions as the hand-written rules it replaced."""

from __future__ import annotations

from dataclasses import replace

from eqsat_fuse.ops import OPS
from eqsat_fuse.resources import data_dir
from eqsat_fuse.saturation import rulegen
from eqsat_fuse.saturation.saturate import RuleProgram


def test_the_shipped_file_is_what_the_table_generates():
    shipped = (data_dir("rules") / rulegen.FILE_NAME).read_text()
    assert shipped == rulegen.generated_rules(), "run python -m eqsat_fuse.saturation.rulegen"
    assert rulegen.main(["--check"]) == 0
    assert all(len(line) <= rulegen.WIDTH for line in shipped.splitlines())


def test_every_elementwise_op_gets_its_fact_and_a_rule_per_fused_slot():
    rules = RuleProgram().rules
    for spec in OPS.values():
        if spec.kind != "elementwise":
            continue
        fact = f"elementwise-{spec.rule_stem}"
        if not spec.fused_inputs:            # Identity, Dropout: removed by canon rules
            assert fact not in rules, spec.name
            continue
        assert rules[fact].ruleset == "analysis" and rules[fact].file.endswith("generated.egg")
        for slot, name in spec.fuse_rule_names().items():
            assert rules[name].ruleset == "fuse", name
    assert set(OPS["Where"].fuse_rule_names().values()) == {
        "fuse-where-cond", "fuse-where-lhs", "fuse-where-rhs"}
    assert OPS["Clip"].fuse_rule_names() == {"x": "fuse-clip"}      # min/max are bounds


def test_a_new_table_entry_is_all_it_takes_to_get_its_rules(monkeypatch):
    monkeypatch.setitem(OPS, "Softplus", replace(OPS["Relu"], name="Softplus"))
    text = rulegen.generated_rules()
    assert '(rule ((= e (Softplus i0))) ((elementwise e)) :ruleset analysis ' \
           ':name "elementwise-softplus")' in text
    assert ('(rule ((= e (Softplus (Mat x))) (fusable x)) ((union e (Softplus x)))'
            in text) and ':name "fuse-softplus")' in text
    assert rulegen.main(["--check"]) == 1          # the shipped file no longer matches
