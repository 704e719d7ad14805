"""Stage 3: the cheapest program chosen from the e-graph under a target cost model.

One job a module, each importing only those above it in this list:

- `costmodel`: a target's cost file (`extract/<target>.toml`) read and checked; its prices
- `cost`: what a program costs and which kernel bodies are legal (`program_cost`,
  `inline_legal`, `Pricing`), and the result every extractor returns (`Extraction`)
- `classgraph`: the class graph's children-first order and strongly connected components
- `milp`: a mixed-integer linear programme, built row by row and solved by HiGHS
- `tree`, `greedy`, `ilp`: the extractors ("tree", "greedy-dag", "ilp"; the ILP states its
  model in `milp` and starts from the greedy answer)
- `registry`: the extractors by name (`EXTRACTORS`) and `extract`, which runs one
- `fusion_values`: what each fused kernel is worth (`--explain`)
"""
