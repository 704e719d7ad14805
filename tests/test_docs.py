"""The documentation stays in step with the code it describes."""

from __future__ import annotations

import re
from pathlib import Path

from eqsat_fuse.frontend.encode import constructor_sorts

DOCS = Path(__file__).resolve().parent.parent / "docs"


def test_rules_md_documents_every_constructor_of_the_term_language():
    text = (DOCS / "rules.md").read_text()
    documented = set(re.findall(r"`\(?([A-Z][A-Za-z]+)", text))
    missing = sorted(set(constructor_sorts()) - documented)
    assert not missing, f"constructors missing from docs/rules.md: {missing}"


def test_rules_md_worked_example_is_the_shipped_example_file():
    text = (DOCS / "rules.md").read_text()
    example = (DOCS / "examples" / "matmul-scale.egg").read_text().strip()
    assert example in text
