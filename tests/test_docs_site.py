"""The documentation site builds without a warning, and the tutorial does what it says.

The tutorial (docs/tutorial.md) marks its code blocks with HTML comments, invisible on the page:
`<!-- tutorial: file NAME -->` before a file the reader saves, `<!-- tutorial: run -->` (or
`run, exits N`) before the commands the reader types, `<!-- tutorial: output -->` before the
lines the last of those commands prints. The test follows the page top to bottom in an empty
folder, as a reader would, with the project's own command line.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
TUTORIAL = DOCS / "tutorial.md"

_MARKED_BLOCK = re.compile(r"<!-- tutorial: (?P<marker>[^>]*?) -->\s*\n```[^\n]*\n(?P<body>.*?)```",
                           re.S)


def tutorial_steps(text: str) -> list[tuple[str, str, str]]:
    """(kind, argument, block) for every marked block: ("file", name, text), ("run", exit
    status, commands) or ("output", "", lines), in page order."""
    steps = []
    for m in _MARKED_BLOCK.finditer(text):
        marker, body = m.group("marker").strip(), m.group("body")
        if marker.startswith("file "):
            steps.append(("file", marker[len("file "):].strip(), body))
        elif marker.startswith("run"):
            status = re.search(r"exits (\d+)", marker)
            steps.append(("run", status.group(1) if status else "0", body))
        elif marker == "output":
            steps.append(("output", "", body))
        else:
            raise AssertionError(f"unknown tutorial marker {marker!r}")
    return steps


def _command(line: str) -> list[str]:
    """A command line of the page, with this environment's Python and eqsat-fuse."""
    words = shlex.split(line, comments=True)
    if not words:
        return []
    if words[0] == "python":
        return [sys.executable, *words[1:]]
    if words[0] == "eqsat-fuse":
        script = Path(sys.executable).with_name("eqsat-fuse")
        launcher = [str(script)] if script.exists() else [sys.executable, "-m", "eqsat_fuse.cli"]
        return [*launcher, *words[1:]]
    raise AssertionError(f"the tutorial runs only python and eqsat-fuse, not {words[0]!r}")


def _normal(line: str) -> str:
    return " ".join(line.split())


def assert_shows(expected_block: str, printed: str) -> None:
    """Every line of the page's block is a line of what was printed, in the same order; a line
    `...` stands for lines left out."""
    printed_lines = [_normal(line) for line in printed.splitlines()]
    at = 0
    for line in expected_block.splitlines():
        want = _normal(line)
        if not want or want == "...":
            continue
        try:
            at = printed_lines.index(want, at) + 1
        except ValueError:
            raise AssertionError(f"the tutorial shows {line.strip()!r}, which the command did not "
                                 f"print (in that order):\n{printed}") from None


def _needs(requirement_check, install: str) -> None:
    """Skip when a system requirement is missing, except under CI, where that fails."""
    try:
        requirement_check()
    except Exception as exc:
        message = f"{exc} ({install}; .ci/run installs it)"
        if os.environ.get("CI"):
            pytest.fail(message + ", but it is missing under CI")
        pytest.skip(message)


def test_tutorial_commands_do_what_the_page_says(tmp_path):
    from eqsat_fuse.tools import html_report

    _needs(html_report.check_requirements, "the tutorial writes an HTML report")
    steps = tutorial_steps(TUTORIAL.read_text(encoding="utf-8"))
    kinds = [kind for kind, _, _ in steps]
    assert kinds.count("run") >= 5 and kinds.count("output") >= 5 and "file" in kinds
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("EQSAT_FUSE_BACKEND", None)         # the reader's default backend, not the suite's
    last_stdout = None
    for kind, argument, block in steps:
        if kind == "file":
            (tmp_path / argument).write_text(block, encoding="utf-8")
        elif kind == "run":
            commands = [(line, _command(line)) for line in block.splitlines()]
            commands = [(line, command) for line, command in commands if command]
            for i, (line, command) in enumerate(commands):
                result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True,
                                        text=True, timeout=300, stdin=subprocess.DEVNULL)
                last_stdout = result.stdout
                status = int(argument) if i == len(commands) - 1 else 0
                assert result.returncode == status, (
                    f"{line!r} exited {result.returncode}, the page says {status}:\n"
                    f"{result.stdout}\n{result.stderr}")
        else:
            assert last_stdout is not None, "an output block before any command"
            assert_shows(block, last_stdout)

    # what the prose says beyond the printed lines
    report = (tmp_path / "matmul_scale.html").read_text(encoding="utf-8")
    assert "k0: MatMul+Relu" in report and "matmul-column-scale-fold" in report
    import eqsat_fuse as ef

    model = tmp_path / "matmul_scale.onnx"
    with_rule = ef.compile(model, rules=[tmp_path / "matmul-scale.egg"],
                           numerics="fast").report.cost
    assert with_rule < ef.compile(model).report.cost


def test_tutorial_files_are_the_shipped_examples():
    steps = tutorial_steps(TUTORIAL.read_text(encoding="utf-8"))
    files = {name: body for kind, name, body in steps if kind == "file"}
    for name in ("matmul-scale.egg", "make_matmul_scale.py"):
        assert files[name].strip() == (DOCS / "examples" / name).read_text().strip(), name


def test_tutorial_step_reader_checks_order():
    assert_shows("a\n...\nc", "a\nb\nc\n")
    with pytest.raises(AssertionError, match="did not print"):
        assert_shows("c\na", "a\nb\nc\n")


def test_mkdocs_site_builds_strictly(tmp_path):
    missing = [m for m in ("mkdocs", "mkdocstrings", "mkdocstrings_handlers.python")
               if not _importable(m)]
    if missing:
        message = (f"{', '.join(missing)} not installed (pip install -e '.[docs]'); "
                   f"the Makefile installs the docs extra")
        if os.environ.get("CI"):
            pytest.fail(message + ", but it is missing under CI")
        pytest.skip(message)
    site = tmp_path / "site"
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
         str(ROOT / "mkdocs.yml"), "--site-dir", str(site)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "WARNING" not in result.stderr, result.stderr
    for page in ("index.html", "quickstart/index.html", "tutorial/index.html",
                 "rules/index.html", "cost-models/index.html", "experiments/index.html",
                 "reliability/index.html", "report/index.html", "api/index.html"):
        assert (site / page).is_file(), page
    api = (site / "api" / "index.html").read_text(encoding="utf-8")
    for name in ("compile", "Compiled", "Report", "Budgets", "check_rules", "EqsatFuseError",
                 "RuleFileError"):
        assert f'id="eqsat_fuse.' in api and name in api, name
    # the tutorial's invisible markers stay out of the reader's way
    assert "tutorial: run" not in re.sub(r"<!--.*?-->", "", (site / "tutorial" / "index.html")
                                         .read_text(encoding="utf-8"), flags=re.S)
    shutil.rmtree(site)


def _importable(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True
