"""eqsat-fuse: operator fusion for ONNX models by equality saturation.

    import eqsat_fuse as ef
    compiled = ef.compile("model.onnx", target="cpu")
    outputs = compiled.run({"x": x})
    print(compiled.report.summary())
    compiled.save("model.eqsat")              # later, in another process: ef.load("model.eqsat")

The public API is what this package exports; where each piece lives inside is free to change
(docs/architecture.md).
"""

from typing import TYPE_CHECKING

from .errors import (ArtifactError, ArtifactWarning, CostModelError, EqsatFuseError, FeedError,
                     LimitError, ModelError, RuleFileError, RunError, VerificationError)

if TYPE_CHECKING:       # the lazy names below, for type checkers and the API docs' reader
    from .checking.report import CheckReport, RuleResult
    from .checking.rulecheck import check_rules
    from .checking.verify import OutputCheck, VerifyResult
    from .compiled import Compiled, TensorSpec, load
    from .pipeline import compile
    from .saturation.limits import HardLimits
    from .saturation.saturate import Budgets, StopReason
    from .tools.report import KernelReport, Report

# The rest is imported when first used (PEP 562): a process that only loads and runs an
# artifact then never imports the compiler (saturation imports egglog, the rule checker
# NumPy's operator table): `import eqsat_fuse` went from 0.64 s to a few milliseconds.
_LAZY = {
    "compile": "pipeline", "load": "compiled", "Compiled": "compiled",
    "TensorSpec": "compiled", "Budgets": "saturation.saturate",
    "StopReason": "saturation.saturate", "HardLimits": "saturation.limits",
    "Report": "tools.report", "KernelReport": "tools.report",
    "VerifyResult": "checking.verify", "OutputCheck": "checking.verify",
    "check_rules": "checking.rulecheck", "CheckReport": "checking.report",
    "RuleResult": "checking.report",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value                 # found directly from now on
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = ["compile", "load", "Compiled", "TensorSpec", "Budgets", "HardLimits", "StopReason",
           "Report", "KernelReport", "VerifyResult", "OutputCheck", "check_rules", "CheckReport",
           "RuleResult", "EqsatFuseError", "ModelError", "RuleFileError", "CostModelError",
           "FeedError", "VerificationError", "LimitError", "RunError", "ArtifactError",
           "ArtifactWarning"]
__version__ = "0.1.0"
