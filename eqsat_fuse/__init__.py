"""eqsat-fuse: operator fusion for ONNX models by equality saturation.

    import eqsat_fuse as ef
    compiled = ef.compile("model.onnx", target="cpu")
    outputs = compiled.run({"x": x})
    print(compiled.report.summary())
"""

from .errors import (CostModelError, EqsatFuseError, FeedError, LimitError, ModelError,
                     RuleFileError, RunError, VerificationError)
from .saturation.limits import HardLimits
from .pipeline import Compiled, compile
from .saturation.saturate import Budgets
from .checking.rulecheck import check_rules

__all__ = ["compile", "Compiled", "Budgets", "EqsatFuseError", "ModelError", "RuleFileError",
           "CostModelError", "FeedError", "VerificationError", "check_rules", "HardLimits",
           "LimitError", "RunError"]
__version__ = "0.1.0"
