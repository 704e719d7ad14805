"""Stage 2, saturate: load the term language and rule files, then run the schedule under budgets.

Rule files are egglog programs. A user's file is data: before it runs it is parsed and every
command in it checked against an allow-list (rulesets, rules, relations), so a rule file can
never read or write files or run anything outside the e-graph. Mistakes come back as
`RuleFileError` with the file, line and column.

The schedule (`rules/schedule.egg`) declares a back-off scheduler and one iteration of the main
loop; Python repeats that iteration until the e-graph saturates or a budget (iterations, e-nodes,
wall time) runs out. A budget stop is not a failure: extraction works on whatever e-graph exists.
The report says why it stopped (`StopReason`) and keeps one `IterationRecord` per iteration
(rules that matched, matches, e-nodes, seconds), as egg's Runner does.
"""

from __future__ import annotations

import dataclasses
import re
import time
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from ..errors import EqsatFuseError, RuleFileError
from ..frontend.encode import Encoding
from ..numerics import code_positions, split_tags
from ..resources import data_dir, rule_files, schedule_file

if TYPE_CHECKING:
    from egglog import bindings

# Commands a user's rule file may contain. Everything else (include, input, output, extract,
# run-schedule, push/pop, new sorts or constructors...) is refused before the file runs.
_USER_ALLOWED = {"AddRuleset", "UnstableCombinedRuleset", "RewriteCommand", "BiRewriteCommand",
                 "RuleCommand", "Relation"}
# Shipped files may also declare functions (analyses) and the term language.
_SHIPPED_ALLOWED = _USER_ALLOWED | {"Sort", "Datatype", "Datatypes", "Constructor",
                                    "FunctionCommand"}
_SPAN = re.compile(r"In (\d+):(\d+)-(?:\d+:)?\d+ of (.*?): (.*)", re.DOTALL)


@dataclass(frozen=True)
class Budgets:
    """Limits on one saturation run; whichever is hit first stops it."""

    iterations: int = 30             # 0 runs no rule: the model as written
    nodes: int = 250_000
    seconds: float = 30.0

    def __post_init__(self):
        for name, flag, value, least in (("iterations", "--max-iterations", self.iterations, 0),
                                         ("nodes", "--max-nodes", self.nodes, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise EqsatFuseError(f"the saturation budget {name} ({flag}) must be a whole "
                                     f"number >= {least}, got {value!r}")
        if isinstance(self.seconds, bool) or not isinstance(self.seconds, (int, float)) \
                or not self.seconds > 0:
            raise EqsatFuseError(f"the saturation budget seconds (--max-seconds) must be a "
                                 f"number > 0, got {self.seconds!r}")


@dataclass(frozen=True)
class RuleInfo:
    """Where a rule is declared, and in which ruleset."""

    name: str
    ruleset: str
    file: str
    line: int
    numerics: str = "exact"     # "fast": tagged `:numerics fast`, loaded only in fast mode


class StopReason(StrEnum):
    """Why saturation stopped. A str: reports, CSV columns and JSON show the value."""

    SATURATED = "saturated"                  # an iteration changed nothing
    ITERATION_BUDGET = "iteration budget"
    NODE_BUDGET = "node budget"
    TIME_BUDGET = "time budget"
    NOT_RUN = "not run"                      # an iteration budget of 0: the model as written
    PASSES_CONVERGED = "passes converged"    # the `passes` strategy: a round cut no cost
    HARD_MEMORY_LIMIT = "hard memory limit"  # the child process hit --hard-limits
    HARD_TIME_LIMIT = "hard time limit"


@dataclass(frozen=True)
class IterationRecord:
    """One iteration of the main loop (one round of the `passes` strategy)."""

    iteration: int                   # from 1
    rules_matched: int               # rules with at least one match in this iteration
    matches: int                     # matches of all rules in this iteration
    egraph_nodes: int                # e-nodes after it
    seconds: float                   # its wall time

    def as_dict(self) -> dict[str, int | float]:
        return dataclasses.asdict(self)


@dataclass
class SaturationReport:
    """Why saturation stopped, how big the e-graph got, and what each rule matched."""

    stop_reason: StopReason
    iterations: int
    egraph_nodes: int
    seconds: float
    matches_per_rule: dict[str, int] = field(default_factory=dict)
    rule_files: list[str] = field(default_factory=list)
    rules: dict[str, RuleInfo] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)    # what the user should know: rules that
                                                      # cannot fire under this strategy, and why
    per_iteration: list[IterationRecord] = field(default_factory=list)   # empty when a hard
                                                      # limit fell back to a snapshot


MAX_NESTING = 500


def _parentheses(text: str):
    """Each parenthesis outside strings and comments: (line, column, char), columns from 1."""
    code = code_positions(text)
    line_number, line_start = 1, 0
    for i, char in enumerate(text):
        if char == "\n":
            line_number, line_start = line_number + 1, i + 1
        elif code[i] and char in "()":
            yield line_number, i - line_start + 1, char


def _check_nesting(text: str, filename: str) -> None:
    """Refuse text nested deeper than MAX_NESTING parentheses: egglog's recursive parser would
    overflow its stack and take the whole process down."""
    depth = 0
    for line_number, column, char in _parentheses(text):
        if char == "(":
            depth += 1
            if depth > MAX_NESTING:
                raise RuleFileError(f"nested more than {MAX_NESTING} parentheses deep",
                                    file=filename, line=line_number, column=column)
        else:
            depth = max(0, depth - 1)


def _unclosed_parenthesis(text: str) -> tuple[int, int] | None:
    """(line, column) of the outermost '(' that is never closed, if any."""
    opened: list[tuple[int, int]] = []
    for line_number, column, char in _parentheses(text):
        if char == "(":
            opened.append((line_number, column))
        elif opened:
            opened.pop()
    return opened[0] if opened else None


def _location(text: str, offset: int) -> tuple[int, int]:
    """(line, column) of egglog's byte `offset` into `text`; the column counts characters."""
    data = text.encode()
    line = data.count(b"\n", 0, offset) + 1
    start = data.rfind(b"\n", 0, offset) + 1
    return line, len(data[start:offset].decode(errors="replace")) + 1


def _command_span(command):
    """The (start offset) of a parsed command, wherever the binding keeps its span."""
    for holder in (command, getattr(command, "rewrite", None), getattr(command, "rule", None)):
        span = getattr(holder, "span", None)
        if span is not None and hasattr(span, "i"):
            return span.i
    return None


def _rule_file_error(exc: Exception, default_file: str, text: str | None = None) -> RuleFileError:
    """egglog's error as one line `file:line:column: reason (at: source)`; a file that ends
    inside an open parenthesis is reported where that parenthesis opened."""
    message = str(exc)
    match = _SPAN.match(message)
    if not match:
        return RuleFileError(" ".join(message.split()), file=default_file)
    line, column, file, rest = match.groups()
    source, _, reason = rest.partition("\n")
    if not reason:                      # no source excerpt before the reason
        source, reason = "", source
    reason = " ".join(reason.split())
    if "unexpected end of file" in reason and text is not None:
        opened = _unclosed_parenthesis(text)
        if opened is not None:
            return RuleFileError("parse error: this parenthesis is never closed (the file ends "
                                 "first)", file=file, line=opened[0], column=opened[1])
    source = " ".join(source.split())
    if source and source not in reason:
        reason += f" (at: {source})"
    return RuleFileError(reason, file=file, line=int(line), column=int(column))


def new_egraph() -> bindings.EGraph:
    """A fresh egglog e-graph. egglog is imported here, on first use (0.2 s), so the CLI and a
    process that only runs artifacts never import it; the hard-limits child replaces this
    function to watch the e-graph (`limits`)."""
    from egglog import bindings
    return bindings.EGraph()


class RuleProgram:
    """An e-graph with the term language, the shipped rules and any user rules loaded.

    In `numerics="exact"` mode (the default) the rules tagged `:numerics fast` are read and
    listed in `rules` (with `numerics="fast"`) but not loaded into the e-graph, so they never
    fire; in "fast" mode they are loaded like the others (see `eqsat_fuse.numerics`)."""

    def __init__(self, user_rules: list[str | Path] | None = None,
                 target_rules: Sequence[str | Path] = (), numerics: str = "exact"):
        self.numerics = numerics
        self.egraph = new_egraph()
        self.files: list[str] = []
        self.rules: dict[str, RuleInfo] = {}
        self.rulesets: list[str] = []
        self._size_command = None          # "(print-size)", parsed once
        for path in rule_files():
            self._load(Path(path), trusted=True)
        schedule = schedule_file()
        self._load(schedule, trusted=True, schedule=True)
        scheduled = set(self.rulesets)
        shipped = data_dir("rules").resolve()
        for path in target_rules:       # a target's own files ([target] rules of its cost file)
            self._load(Path(path), trusted=Path(path).resolve().is_relative_to(shipped))
        for path in user_rules or []:
            self._load(Path(path), trusted=False)
        self._schedule_extra_rulesets([r for r in self.rulesets if r not in scheduled])

    def _schedule_extra_rulesets(self, rulesets: list[str]) -> None:
        """Rulesets that target or user files declare run after the shipped schedule's step,
        under a back-off scheduler of their own."""
        if not rulesets:
            return
        runs = " ".join(f"(run-with $extra-backoff {name})" for name in rulesets)
        commands = self.egraph.parse_program(
            "(let-scheduler $extra-backoff (back-off :match-limit 20000 :ban-length 3))\n"
            f"(run-schedule (seq {runs}))", filename="<schedule of extra rulesets>")
        self.egraph.run_program(commands[0])
        self.iteration = [*self.iteration, *commands[1:]]

    def _load(self, path: Path, *, trusted: bool, schedule: bool = False) -> None:
        try:
            text = path.read_text()
        except OSError as exc:
            raise RuleFileError(f"cannot read the rule file: {exc.strerror}", file=str(path)) from None
        except UnicodeDecodeError:
            raise RuleFileError("not a text file", file=str(path)) from None
        text, tags = split_tags(text, str(path))
        data = text.encode()
        commands = self._parse(text, str(path))
        allowed = _SHIPPED_ALLOWED if trusted else _USER_ALLOWED
        setup, iteration = [], []
        for command in commands:
            kind = type(command).__name__
            if schedule and kind == "UserDefined" and command.name == "run-schedule":
                iteration.append(command)
                continue
            if schedule and kind == "UserDefined" and command.name == "let-scheduler":
                setup.append(command)
                continue
            if kind not in allowed:
                offset = _command_span(command)
                line, column = _location(text, offset) if offset is not None else (None, None)
                what = getattr(command, "name", kind) if kind == "UserDefined" else kind
                raise RuleFileError(
                    f"command {what!r} is not allowed in a rule file (a rule file may only "
                    f"declare rulesets, rules and relations)", file=str(path), line=line,
                    column=column)
            offset = _command_span(command)
            fast = offset is not None and tags.fast_at(data, offset)
            self._note_rule(command, text, str(path), "fast" if fast else "exact")
            if fast and self.numerics != "fast":
                continue
            setup.append(command)
        try:
            self.egraph.run_program(*setup)
        except Exception as exc:
            raise _rule_file_error(exc, str(path), text) from None
        self.files.append(str(path))
        if schedule:
            self.iteration = iteration

    def _parse(self, text: str, filename: str):
        _check_nesting(text, filename)
        try:
            return self.egraph.parse_program(text, filename=filename)
        except Exception as exc:
            raise _rule_file_error(exc, filename, text) from None

    def _note_rule(self, command, text: str, file: str, numerics: str = "exact") -> None:
        kind = type(command).__name__
        if kind == "AddRuleset":
            self.rulesets.append(command.name)
            return
        if kind in ("RewriteCommand", "BiRewriteCommand"):
            name, ruleset, span = command.rewrite.name, command.name, command.rewrite.span
        elif kind == "RuleCommand":
            name, ruleset, span = command.rule.name, command.rule.ruleset, command.rule.span
            for action in command.rule.head:
                if type(action).__name__ == "Panic":
                    line, column = _location(text, action.span.i)
                    raise RuleFileError(f"rule {name or '(unnamed)'!r} has a panic action, which "
                                        f"would abort the whole run; rules may only add terms, "
                                        f"unions and facts", file=file, line=line, column=column)
        else:
            return
        if not name:
            line, column = _location(text, span.i)
            raise RuleFileError("every rule needs a :name (it is how reports and the soundness "
                                 "checker refer to it)", file=file, line=line, column=column)
        if name in self.rules:
            other = self.rules[name]
            line, column = _location(text, span.i)
            raise RuleFileError(f"rule name {name!r} is already used at {other.file}:{other.line}",
                                file=file, line=line, column=column)
        self.rules[name] = RuleInfo(name, ruleset, file, _location(text, span.i)[0], numerics)

    def run_text(self, text: str, filename: str) -> None:
        """Run trusted egglog text (a rule test case: lets, facts, runs, checks) on this
        e-graph, with no allow-list. An egglog error, a failed `(check ...)` included, comes back
        as `RuleFileError` at `filename:line:column`."""
        commands = self._parse(text, filename)
        try:
            self.egraph.run_program(*commands)
        except Exception as exc:   # egglog's own error type
            raise _rule_file_error(exc, filename, text) from None

    def size(self) -> int:
        """E-nodes in the e-graph now."""
        if self._size_command is None:
            self._size_command = self.egraph.parse_program("(print-size)")
        return sum(n for _, n in self.egraph.run_program(*self._size_command)[0].sizes)

    def run_iteration(self, iteration: int) -> tuple[bool, dict[str, int]]:
        """Run the schedule's iteration once (the `iteration`-th): whether the e-graph may have
        saturated (nothing changed and every scheduler may stop; the caller compares sizes too)
        and how often each rule matched in it."""
        try:
            outputs = self.egraph.run_program(*self.iteration)
        except Exception as exc:   # egglog's own error type: a rule failed while running
            raise EqsatFuseError(f"egglog failed while running the rules (iteration "
                                 f"{iteration}): {' '.join(str(exc).split())}") from None
        quiet, matches = True, {}
        for output in outputs:
            report = output.report
            quiet &= not report.updated and report.can_stop
            for rule, count in report.num_matches_per_rule.items():
                matches[rule] = matches.get(rule, 0) + count
        return quiet, matches

    def run_schedule(self, max_iterations: int = 30) -> int:
        """Repeat the schedule's iteration until the e-graph saturates, as `saturate` does, or
        `max_iterations` have run; return how many ran."""
        nodes = self.size()
        for iteration in range(1, max_iterations + 1):
            quiet, _ = self.run_iteration(iteration)
            new_nodes = self.size()
            if quiet and new_nodes == nodes:
                return iteration
            nodes = new_nodes
        return max_iterations


def saturate(encoding: Encoding, user_rules: list[str | Path] | None = None,
             budgets: Budgets = Budgets(),
             target_rules: Sequence[str | Path] = (), numerics: str = "exact"
             ) -> tuple[bindings.EGraph, SaturationReport]:
    """Run the rules on the encoded model until saturation or a budget; return e-graph and report.

    `target_rules` are the rule files only the target loads (`CostModel.rule_files`, from its
    cost file's `[target] rules`); `numerics` ("exact" or "fast") says whether the rules tagged
    `:numerics fast` run (see `RuleProgram`)."""
    started = time.perf_counter()
    program = RuleProgram(user_rules, target_rules, numerics)
    egraph = program.egraph
    egraph.run_program(*egraph.parse_program(encoding.program, filename="<model>"))
    matches: dict[str, int] = {}
    records: list[IterationRecord] = []
    nodes = program.size()
    stop_reason = StopReason.ITERATION_BUDGET if budgets.iterations else StopReason.NOT_RUN
    iterations = 0
    while iterations < budgets.iterations:
        if nodes >= budgets.nodes:
            stop_reason = StopReason.NODE_BUDGET
            break
        if time.perf_counter() - started >= budgets.seconds:
            stop_reason = StopReason.TIME_BUDGET
            break
        iteration_start = time.perf_counter()
        iterations += 1
        quiet, this_iteration = program.run_iteration(iterations)
        for rule, count in this_iteration.items():
            matches[rule] = matches.get(rule, 0) + count
        new_nodes = program.size()
        records.append(iteration_record(iterations, this_iteration, new_nodes,
                                        time.perf_counter() - iteration_start))
        if quiet and new_nodes == nodes:
            stop_reason = StopReason.SATURATED
            nodes = new_nodes
            break
        nodes = new_nodes
    return egraph, SaturationReport(
        stop_reason=stop_reason, iterations=iterations, egraph_nodes=nodes,
        seconds=time.perf_counter() - started,
        matches_per_rule={r: c for r, c in sorted(matches.items()) if c},
        rule_files=program.files, rules=program.rules, per_iteration=records)


def iteration_record(iteration: int, matches: dict[str, int], nodes: int,
                     seconds: float) -> IterationRecord:
    """The record of one iteration from its per-rule match counts."""
    return IterationRecord(iteration=iteration,
                           rules_matched=sum(1 for count in matches.values() if count),
                           matches=sum(matches.values()), egraph_nodes=nodes, seconds=seconds)
