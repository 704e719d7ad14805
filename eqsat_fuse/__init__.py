"""eqsat-fuse: operator fusion for ONNX models by equality saturation.

    import eqsat_fuse as ef
    compiled = ef.compile("model.onnx", target="cpu")
    outputs = compiled.run({"x": x})
    print(compiled.report.summary())
"""

from .errors import (CostModelError, EqsatFuseError, FeedError, ModelError, RuleFileError,
                     VerificationError)
from .pipeline import Compiled, compile
from .rulecheck import check_rules
from .saturate import Budgets

__all__ = ["compile", "Compiled", "Budgets", "EqsatFuseError", "ModelError", "RuleFileError",
           "CostModelError", "FeedError", "VerificationError", "check_rules"]
__version__ = "0.1.0"
