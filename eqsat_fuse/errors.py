"""The errors eqsat-fuse raises for a user's mistake.

Each carries a message that names what is wrong and where (file, line, input name), so the CLI
can print it without a traceback. A bug inside eqsat-fuse stays an ordinary exception.
"""

from __future__ import annotations


class EqsatFuseError(Exception):
    """Base class: a problem with what the user gave us, with a readable message."""


class ModelError(EqsatFuseError):
    """The ONNX model cannot be read or compiled (bad file, unknown shapes, unsupported form)."""


class ExportError(EqsatFuseError):
    """The compiled program holds something that has no ONNX form here (`to_onnx`)."""


class RuleFileError(EqsatFuseError):
    """A rule file is malformed or uses a forbidden command; names the file, line and column."""

    def __init__(self, message: str, *, file: str | None = None, line: int | None = None,
                 column: int | None = None):
        where = ""
        if file is not None:
            where = file
            if line is not None:
                where += f":{line}"
                if column is not None:
                    where += f":{column}"
            where += ": "
        super().__init__(where + message)
        self.file, self.line, self.column = file, line, column


class CostModelError(EqsatFuseError):
    """A cost-model file is missing a key, has an unknown key or a bad value."""


class FeedError(EqsatFuseError):
    """The inputs given to run() do not match the model (name, dtype or shape)."""


class RunError(EqsatFuseError):
    """A run failed on the values fed: an index fed at run time is out of range, for one."""


class VerificationError(EqsatFuseError):
    """The compiled program does not compute what the original model computes."""


class LimitError(EqsatFuseError):
    """A hard limit (memory or time of the saturation child) was hit with nothing to fall back
    to, or cannot be set here."""


class ArtifactError(EqsatFuseError):
    """A saved artifact cannot be written or loaded: missing, truncated or tampered with (a
    file whose SHA-256 is not the recorded one), of an unknown format version, or made for
    another machine or version when recompiling is not allowed."""


class ArtifactWarning(UserWarning):
    """A saved artifact loads, but not as saved: made by another eqsat-fuse, Numba or Python,
    or for another CPU, so its kernels are compiled again from the stored plan."""
