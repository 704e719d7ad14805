"""The fixed-order baseline: the same rules, applied as a classic pass pipeline.

Instead of keeping every alternative in one e-graph, each pass saturates one ruleset on the
current program, commits to the cheapest program under the target's cost model and discards
the rest, which is what a pass that rewrites in place does. The passes run in a set order
(canon, fold, fuse, then any target or user rulesets) and the pipeline repeats until a whole
round no longer lowers the cost. Comparing it with equality saturation shows what committing
early, in a fixed order, costs (`eqsat-fuse compare`, strategy `passes`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Sequence

from ..extraction.cost import roots_of
from ..extraction.costmodel import CostModel
from ..extraction.registry import extract
from ..frontend.encode import Encoding, encode_choice
from ..ir import Graph
from .saturate import (Budgets, IterationRecord, RuleProgram, SaturationReport, StopReason,
                       iteration_record)
from .serialized import read_for_extraction

SHIPPED_PASSES = ("canon", "fold", "fuse")
_LEAVES = {"Mat", "Const", "Input"}


def _fused_term(pattern, sorts: dict) -> str | None:
    """The first subterm of `pattern` that holds an operator inline in another, with no Mat
    between ("(Relu (Relu x))"): a fused term, which the encoder never writes."""
    from ..checking.patterns import Call

    if not isinstance(pattern, Call):
        return None
    is_op = pattern.op in sorts and sorts[pattern.op][1] == "T" and pattern.op not in _LEAVES
    for arg in pattern.args:
        if is_op and isinstance(arg, Call) and arg.op in sorts and sorts[arg.op][1] == "T" \
                and arg.op not in _LEAVES:
            return str(pattern)
        found = _fused_term(arg, sorts)
        if found:
            return found
    return None


def unreachable_rules(user_rules: list[str | Path] | None, matches: dict[str, int]) -> list[str]:
    """One line per user rule that matched nothing under the pass pipeline because its pattern
    needs fused terms, which a pass sees only where an earlier pass committed that fusion."""
    from ..frontend.encode import constructor_sorts
    from ..checking.patterns import parse_rule_files

    if not user_rules:
        return []
    sorts = constructor_sorts()
    notes = []
    for rule in parse_rule_files([Path(p) for p in user_rules]):
        if matches.get(rule.name) or rule.ruleset == "analysis":
            continue
        patterns = [rule.lhs, *(p for _, p in rule.matched)]
        term = next((t for t in (_fused_term(p, sorts) for p in patterns if p is not None) if t),
                    None)
        if term is None:
            continue
        notes.append(f"rule {rule.name!r} ({rule.location}, ruleset {rule.ruleset}) cannot fire "
                     f"under the passes strategy here: its pattern needs the fused term {term}, "
                     f"and each pass sees only the program the previous one committed to, which "
                     f"holds no such fusion (equality saturation keeps every fusion alternative "
                     f"for it: strategy eqsat)")
    return notes


def _load(program: RuleProgram, encoding: Encoding) -> None:
    egraph = program.egraph
    egraph.run_program(*egraph.parse_program(encoding.program, filename="<program>"))


def saturate_by_passes(encoding: Encoding, graph: Graph, user_rules: list[str | Path] | None,
                       budgets: Budgets, target_rules: Sequence[str], cost_model: CostModel,
                       extractor: str = "greedy-dag", numerics: str = "exact"):
    """Run the pass pipeline; returns (e-graph holding the final program, report, its encoding).

    Each pass runs its ruleset (under the back-off scheduler) until it stops changing the
    e-graph or `budgets.iterations` runs; `budgets.seconds` bounds the whole pipeline.
    """
    started = time.perf_counter()
    probe = RuleProgram(user_rules, target_rules, numerics)
    passes = [*SHIPPED_PASSES, *(r for r in probe.rulesets
                                  if r not in SHIPPED_PASSES and r != "analysis")]
    matches: dict[str, int] = {}
    records: list[IterationRecord] = []
    current, best_cost = encoding, float("inf")
    rounds, nodes = 0, 0
    stop_reason = StopReason.ITERATION_BUDGET if budgets.iterations else StopReason.NOT_RUN
    while rounds < budgets.iterations and stop_reason == StopReason.ITERATION_BUDGET:
        rounds += 1
        round_start_cost, round_started = best_cost, time.perf_counter()
        round_matches: dict[str, int] = {}
        for ruleset in passes:
            if time.perf_counter() - started >= budgets.seconds:
                stop_reason = StopReason.TIME_BUDGET
                break
            program = RuleProgram(user_rules, target_rules, numerics)
            _load(program, current)
            step = program.egraph.parse_program(
                f"(run-schedule (seq (saturate (run analysis)) (run-with $backoff {ruleset})))",
                filename="<pass>")
            for _ in range(budgets.iterations):
                changed = False
                for output in program.egraph.run_program(*step):
                    changed |= output.report.updated
                    for rule, count in output.report.num_matches_per_rule.items():
                        round_matches[rule] = round_matches.get(rule, 0) + count
                if not changed:
                    break
            eg, priced = read_for_extraction(program.egraph, current.dim_codes,
                                             graph.signature and graph.signature.representative)
            nodes = max(nodes, len(eg.nodes))
            chosen = extract(priced, roots_of(priced, current.output_vars), cost_model,
                             extractor)
            current = encode_choice(eg, chosen.choice, current, graph)
            best_cost = min(best_cost, chosen.cost)
        else:
            if best_cost >= round_start_cost * (1 - 1e-9):
                stop_reason = StopReason.PASSES_CONVERGED
        for rule, count in round_matches.items():
            matches[rule] = matches.get(rule, 0) + count
        records.append(iteration_record(rounds, round_matches, nodes,
                                        time.perf_counter() - round_started))
    final = RuleProgram(user_rules, target_rules, numerics)
    _load(final, current)
    final.egraph.run_program(*final.egraph.parse_program("(run-schedule (saturate (run analysis)))",
                                                         filename="<analysis>"))
    report = SaturationReport(
        stop_reason=stop_reason, iterations=rounds, egraph_nodes=nodes,
        seconds=time.perf_counter() - started,
        matches_per_rule={r: c for r, c in sorted(matches.items()) if c},
        rule_files=final.files, rules=final.rules,
        notes=unreachable_rules(user_rules, matches), per_iteration=records)
    return final.egraph, report, current
