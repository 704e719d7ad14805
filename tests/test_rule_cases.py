"""Rule cases: small egglog programs that test the shipped rules at the stage they run.

Each file under tests/rule_cases/ holds cases for one ruleset or theme. A case starts at a line
`; case: NAME` and runs to the next one; it builds a small term with `(let ...)` and the facts
the encoder states (shape, dtype, dynamic, scalar-value), runs rules, then checks what the rules
must equate, `(check (= a b))`, and what they must not, `(fail (check ...))`. A line holding only
`(saturate-schedule)` repeats the shipped schedule until the e-graph saturates (as `saturate`
does); a plain egglog `(run-schedule ...)` runs single rulesets. Commands before the first case
are a prelude that runs before each case. Every case runs on a fresh `RuleProgram`: the shipped
rule files, loaded as `saturate` loads them, plus the target's own file for cases under
tests/rule_cases/targets/<target>.egg; a case with a line `; numerics: fast` loads the rules
tagged `:numerics fast` too (as `--fast-math` does), any other case runs in the default exact
mode, without them. A failing check is reported as `FILE:LINE:COLUMN: ...`.
See tests/rule_cases/README and docs/rules.md ("Testing a rule").
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from eqsat_fuse.errors import RuleFileError
from eqsat_fuse.resources import all_target_rule_files
from eqsat_fuse.saturation import saturate as saturate_module
from eqsat_fuse.saturation.saturate import RuleProgram

CASES = Path(__file__).resolve().parent / "rule_cases"
_CASE = re.compile(r";\s*case:\s*([\w.-]+)\s*")
_FAST = re.compile(r";\s*numerics:\s*fast\s*")
_SCHEDULE = re.compile(r"\s*\(saturate-schedule\)\s*(;.*)?")
_LET = re.compile(r"\(let\s+(\$[\w-]+)")
_GLOBAL = re.compile(r"\$[\w-]+")


@dataclass(frozen=True)
class Case:
    """One case block of a case file: its lines (numbered from 1) and the prelude's."""

    file: Path
    name: str
    first_line: int
    lines: list[str]        # the case's own lines
    prelude: list[str]      # the lines before the file's first case

    @property
    def target(self) -> str | None:
        """The target whose own rules this case needs (cases under rule_cases/targets/)."""
        return self.file.stem if self.file.parent.name == "targets" else None

    @property
    def numerics(self) -> str:
        """"fast" for a case with a `; numerics: fast` line, else "exact"."""
        return "fast" if any(_FAST.fullmatch(line) for line in self.lines) else "exact"


def parse_cases(path: Path) -> list[Case]:
    """The cases of one case file, in order."""
    lines = path.read_text().splitlines()
    starts = []
    for i, line in enumerate(lines):
        if match := _CASE.fullmatch(line):
            starts.append((i, match.group(1)))
        elif line.startswith("; case:"):
            raise RuleFileError("a case line is `; case: NAME`, NAME one word (letters, digits, "
                                "., -, _)", file=str(path), line=i + 1)
    prelude = lines[:starts[0][0]] if starts else lines
    cases = []
    for k, (start, name) in enumerate(starts):
        end = starts[k + 1][0] if k + 1 < len(starts) else len(lines)
        cases.append(Case(path, name, start + 1, lines[start:end], prelude))
    return cases


def program_for(target: str | None, numerics: str = "exact") -> RuleProgram:
    """A fresh e-graph with the shipped rules and, for a target, its own shipped rule file
    (scheduled after the shipped rulesets, as when compiling for that target)."""
    if target is None:
        return RuleProgram(numerics=numerics)
    files = [p for p in all_target_rule_files() if p.stem == target]
    assert files, f"no shipped rule file for target {target!r}"
    return RuleProgram(target_rules=files, numerics=numerics)


def run_case(case: Case, program: RuleProgram | None = None) -> RuleProgram:
    """Run one case on a fresh program (or `program`); a failing command raises RuleFileError
    naming the case file and line. Text is run in segments split at `(saturate-schedule)`
    lines, each padded with blank lines so that egglog's spans keep the file's line numbers."""
    program = program or program_for(case.target, case.numerics)
    filename = str(case.file)
    defined: set[str] = set()

    def run(start: int, text: list[str]) -> None:
        source = "\n" * (start - 1) + "\n".join(text)
        defined.update(_LET.findall(source))
        check_negatives(program, source, filename, defined)
        program.run_text(source, filename)

    run(1, case.prelude)
    start, text = case.first_line, []
    for number, line in enumerate(case.lines, start=case.first_line):
        if _SCHEDULE.fullmatch(line):
            run(start, text)
            program.run_schedule()
            start, text = number + 1, []
        else:
            text.append(line)
    run(start, text)
    return program


def check_negatives(program: RuleProgram, source: str, filename: str, defined: set[str]) -> None:
    """Refuse a `(fail ...)` that names an undefined `$global`: egglog's `fail` would swallow
    that error too, and the negative check would pass whatever the rules do."""
    for command in program.egraph.parse_program(source, filename=filename):
        if type(command).__name__ != "Fail":
            continue
        unbound = sorted(set(_GLOBAL.findall(str(command))) - defined)
        if unbound:
            line = source.encode().count(b"\n", 0, command.span.i) + 1
            raise RuleFileError(f"this negative check names {', '.join(unbound)}, which no "
                                f"`(let ...)` before it defines", file=filename, line=line)


ALL_CASES = [c for path in sorted(CASES.rglob("*.egg")) for c in parse_cases(path)]


@pytest.mark.parametrize("case", ALL_CASES,
                         ids=[f"{c.file.relative_to(CASES)}::{c.name}" for c in ALL_CASES])
def test_rule_case(case):
    assert any("(check" in line for line in case.lines), \
        f"{case.file}:{case.first_line}: case {case.name!r} checks nothing"
    run_case(case)


def test_every_case_file_has_cases_with_unique_names():
    files = sorted(CASES.rglob("*.egg"))
    assert {p.stem for p in files} >= {"analysis", "canon", "fold", "fuse", "generated",
                                        "edge-npu"}
    for path in files:
        names = [c.name for c in parse_cases(path)]
        assert names, f"{path}: no `; case: NAME` line"
        assert len(names) == len(set(names)), f"{path}: duplicate case names {names}"


WRONG = """\
; a deliberately wrong case file
; case: wrong-check
(let $x (Input "x"))
(set (shape $x) (vec-of 2))
(set (dtype $x) "float32")
(let $r (Relu $x))
(saturate-schedule)
(check (= $r $x))
; case: wrong-negative
(let $x (Input "x"))
(saturate-schedule)
(fail (check (= $x $x)))
; case: wrong-global
(let $x (Input "x"))
(fail (check (= $y $x)))
"""


def test_a_failing_check_is_reported_with_its_file_and_line(tmp_path):
    path = tmp_path / "wrong.egg"
    path.write_text(WRONG)
    wrong_check, wrong_negative, _ = parse_cases(path)
    with pytest.raises(RuleFileError) as failed:
        run_case(wrong_check)
    assert (failed.value.file, failed.value.line) == (str(path), 8)
    assert str(failed.value).startswith(f"{path}:8:1: Check failed")
    with pytest.raises(RuleFileError) as failed:
        run_case(wrong_negative)
    assert (failed.value.file, failed.value.line) == (str(path), 12)
    assert "should have failed" in str(failed.value)


def test_a_negative_check_naming_an_undefined_global_is_refused(tmp_path):
    path = tmp_path / "wrong.egg"
    path.write_text(WRONG)
    wrong_global = parse_cases(path)[2]
    with pytest.raises(RuleFileError, match=r"names \$y") as failed:
        run_case(wrong_global)
    assert (failed.value.file, failed.value.line) == (str(path), 15)


def test_a_broken_rule_fails_its_negative_case(tmp_path, monkeypatch):
    """add-zero without its `(boundary x)` condition equates a kernel output with an inline
    term; the canon case that guards the condition reports the failing line."""
    shipped = saturate_module.rule_files()
    broken = []
    for path in shipped:
        copy = tmp_path / path.name
        text = path.read_text()
        if path.name == "canon.egg":
            rule = '(= e (Add x c)) (boundary x) (dynamic x)'
            assert rule in text
            text = text.replace(rule, '(= e (Add x c)) (dynamic x)')
        copy.write_text(text)
        broken.append(copy)
    monkeypatch.setattr(saturate_module, "rule_files", lambda: broken)
    case = next(c for c in parse_cases(CASES / "canon.egg") if c.name == "add-zero-not-inline")
    with pytest.raises(RuleFileError) as failed:
        run_case(case)
    line = next(n for n, text in enumerate(case.lines, start=case.first_line)
                if text.startswith("(fail (check (= $ma $r)))"))
    assert (failed.value.file, failed.value.line) == (str(case.file), line)
    monkeypatch.undo()
    run_case(case)      # the shipped rule passes the same case


def test_the_example_in_docs_rules_md_is_a_passing_case(tmp_path):
    docs = (Path(__file__).resolve().parent.parent / "docs" / "rules.md").read_text()
    section = docs[docs.index("## Testing a rule"):]
    example = section[section.index("```lisp\n") + 8:section.index("```\n", 8)]
    path = tmp_path / "example.egg"
    path.write_text(example)
    (case,) = parse_cases(path)
    run_case(case)


def test_a_malformed_case_line_is_refused_with_its_line(tmp_path):
    path = tmp_path / "bad.egg"
    path.write_text("; case: fine\n(check (= (Absent) (Absent)))\n; case: two words\n")
    with pytest.raises(RuleFileError, match=r"bad\.egg:3: a case line"):
        parse_cases(path)
