"""Trust: the rule soundness checker and the verification of compiled programs."""
