"""Where the shipped data lives: the rule files (`rules/`) and cost models (`extract/`).

In a wheel they sit inside the package (`eqsat_fuse/data/...`); in a source checkout they sit at
the top of the repository. Both layouts are looked up here, and only here.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent


def data_dir(name: str) -> Path:
    """The folder of shipped data called `name` ("rules" or "extract")."""
    for candidate in (_PACKAGE_DIR / "data" / name, _PACKAGE_DIR.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"eqsat-fuse is installed without its '{name}' folder "
                            f"(looked in {_PACKAGE_DIR / 'data' / name} and {_PACKAGE_DIR.parent / name})")


def rule_files() -> list[Path]:
    """The shipped rule files in load order: the term language first, then the rest by name."""
    folder = data_dir("rules")
    language = folder / "lang.egg"
    others = sorted(p for p in folder.glob("*.egg") if p.name not in ("lang.egg", "schedule.egg"))
    return [language, *others]


def all_target_rule_files() -> list[Path]:
    """Every shipped target's own rule files (the cost files' `[target] rules` name them)."""
    return sorted((data_dir("rules") / "targets").glob("*.egg"))


def schedule_file() -> Path:
    """The shipped schedule: which rulesets run in which order."""
    return data_dir("rules") / "schedule.egg"


def cost_model_file(target: str) -> Path:
    """The shipped cost model of `target` (e.g. "cpu")."""
    return data_dir("extract") / f"{target}.toml"


def targets() -> list[str]:
    """Names of the shipped targets."""
    return sorted(p.stem for p in data_dir("extract").glob("*.toml"))
