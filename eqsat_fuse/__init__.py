"""eqsat-fuse: operator fusion for ONNX models by equality saturation.

    import eqsat_fuse as ef
    compiled = ef.compile("model.onnx", target="cpu")
    outputs = compiled.run({"x": x})
    print(compiled.report.summary())
    compiled.save("model.eqsat")              # later, in another process: ef.load("model.eqsat")

The public API is what this package exports; where each piece lives inside is free to change
(docs/architecture.md).
"""

from .checking.report import CheckReport, RuleResult
from .checking.rulecheck import check_rules
from .checking.verify import OutputCheck, VerifyResult
from .errors import (ArtifactError, ArtifactWarning, CostModelError, EqsatFuseError, FeedError,
                     LimitError, ModelError, RuleFileError, RunError, VerificationError)
from .pipeline import Compiled, TensorSpec, compile, load
from .saturation.limits import HardLimits
from .saturation.saturate import Budgets, StopReason
from .tools.report import KernelReport, Report

__all__ = ["compile", "load", "Compiled", "TensorSpec", "Budgets", "HardLimits", "StopReason",
           "Report", "KernelReport", "VerifyResult", "OutputCheck", "check_rules", "CheckReport",
           "RuleResult", "EqsatFuseError", "ModelError", "RuleFileError", "CostModelError",
           "FeedError", "VerificationError", "LimitError", "RunError", "ArtifactError",
           "ArtifactWarning"]
__version__ = "0.1.0"
