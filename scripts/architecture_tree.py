"""Rewrite the module tree of docs/architecture.md (between `<!-- tree -->` and
`<!-- /tree -->`) from the package itself: one line per module, its line count and the first
line of its docstring; a package's line is its `__init__.py` docstring.

    python scripts/architecture_tree.py            rewrite docs/architecture.md
    python scripts/architecture_tree.py --check    exit 1 if the file lists other modules
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "eqsat_fuse"
DOC = ROOT / "docs" / "architecture.md"
WIDTH = 128
_BLOCK = re.compile(r"(<!-- tree -->\n```text\n)(.*?)(```\n<!-- /tree -->)", re.S)


def _first_line(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    paragraph = doc.split("\n\n")[0]
    return " ".join(paragraph.split())


def _line(indent: str, name: str, count: str, doc: str) -> str:
    head = f"{indent}{name:<24}{count:>3}  "
    if len(head) + len(doc) > WIDTH:
        doc = doc[: WIDTH - len(head) - 2].rsplit(" ", 1)[0] + " …"
    return head + doc


def tree_lines(package: Path = PACKAGE, indent: str = "  ") -> list[str]:
    """The lines of `package`'s modules, then of its subpackages, each sorted by name."""
    lines = []
    for module in sorted(p for p in package.glob("*.py") if p.name != "__init__.py"):
        count = len(module.read_text(encoding="utf-8").splitlines())
        lines.append(_line(indent, module.name, str(count), _first_line(module)))
    for sub in sorted(p for p in package.iterdir() if (p / "__init__.py").is_file()):
        lines.append(_line(indent, sub.name + "/", "", _first_line(sub / "__init__.py")))
        lines.extend(tree_lines(sub, indent + "  "))
    return lines


def current_tree() -> str:
    return "eqsat_fuse/\n" + "\n".join(tree_lines()) + "\n"


def listed_modules(text: str) -> set[str]:
    """The module paths (`tools/compare.py`) a tree block lists, from its indentation."""
    block = _BLOCK.search(text).group(2)
    stack: list[str] = []
    found = set()
    for line in block.splitlines()[1:]:
        depth = (len(line) - len(line.lstrip(" "))) // 2 - 1
        name = line.split()[0]
        stack = stack[:depth]
        if name.endswith("/"):
            stack.append(name.rstrip("/"))
        else:
            found.add("/".join(stack + [name]))
    return found


def main(argv: list[str]) -> int:
    text = DOC.read_text(encoding="utf-8")
    if not _BLOCK.search(text):
        print(f"{DOC}: no <!-- tree --> block", file=sys.stderr)
        return 2
    if "--check" in argv:
        on_disk = {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                   if p.name != "__init__.py" and "__pycache__" not in p.parts}
        listed = listed_modules(text)
        if on_disk != listed:
            print(f"{DOC} is out of date: missing {sorted(on_disk - listed)}, "
                  f"gone {sorted(listed - on_disk)}; run python scripts/architecture_tree.py",
                  file=sys.stderr)
            return 1
        return 0
    DOC.write_text(_BLOCK.sub(lambda m: m.group(1) + current_tree() + m.group(3), text),
                   encoding="utf-8")
    print(f"wrote the module tree of {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
