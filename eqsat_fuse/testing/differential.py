"""The differential runner: `check_case` compiles a drawn case with eqsat-fuse and compares it
with onnxruntime."""

from __future__ import annotations

from .case import GraphCase


def check_case(case: GraphCase, backend: str = "numpy", **compile_kwargs):
    """Compile `case.model`, run it on `case.feeds` and compare with onnxruntime through
    `compiled.verify(case.feeds)`. Raises AssertionError (with the description, the verify
    summary and the model as text) when eqsat-fuse fails or differs; returns the `Compiled`."""
    import eqsat_fuse as ef
    from ..checking.verify import oracle_outputs

    def fail(what: str, exc: BaseException | None = None):
        detail = f"{type(exc).__name__}: {exc}\n" if exc is not None else ""
        return AssertionError(f"{what}\n{detail}case: {case.text()}")

    try:
        compiled = ef.compile(case.model, backend=backend, **compile_kwargs)
    except Exception as exc:
        raise fail("eqsat-fuse failed to compile the model", exc) from exc
    try:
        result = compiled.verify(case.feeds)
    except Exception as exc:
        try:
            oracle_outputs(case.model, case.feeds, "ort")
        except Exception as ort_exc:
            raise fail("onnxruntime cannot run the generated model (a bug of "
                       "eqsat_fuse.testing)", ort_exc) from ort_exc
        raise fail("the compiled program failed to run", exc) from exc
    if not result.ok:
        raise AssertionError(f"eqsat-fuse differs from {result.against}\n"
                             f"{result.summary()}\ncase: {case.text()}")
    return compiled
