"""Trust: the rule soundness checker and the verification of compiled programs.

- `verify`: does the compiled program compute what the original model computes (against
  onnxruntime, or `onnx.reference`)?
- `rulecheck`: the rule soundness checker's driver (`check_rules`, ``eqsat-fuse rules check``),
  built from, in import order (each imports only modules listed before it):
  `primitives` (what egglog's primitives and fact functions compute), `patterns` (the
  rule-pattern language and the `.egg` parser), `hints` (what a rule's conditions fix about a
  sample), `sample` (one attempt at instantiating a rule), `shape_generators` and `generators`
  (one sample generator per operator) and `report` (comparing the sides, `RuleResult`,
  `CheckReport`).
"""
