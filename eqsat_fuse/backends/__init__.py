"""The code that runs kernels (NumPy and Numba backends, the onnx.reference runner) and the
registry of backends: name -> factory (`backends.base` describes the interface).

Factories import their backend when called, so importing this package loads neither NumPy's
operator table nor Numba (which the Numba backend alone needs).
"""

from __future__ import annotations

from ..errors import EqsatFuseError
from .base import Backend, BackendContext, BackendFactory


def _numpy(context: BackendContext) -> Backend:
    from .numpy.backend import NumpyBackend
    return NumpyBackend(context)


def _numba(context: BackendContext) -> Backend:
    from .numba.binder import NumbaAdapter
    return NumbaAdapter(context)


# name -> factory; the first is the default. Validation messages, the CLI's --backend choices
# and the tests that run every backend read it.
BACKENDS: dict[str, BackendFactory] = {"numpy": _numpy, "numba": _numba}


def backend_names() -> tuple[str, ...]:
    """The registered backends' names, in registry order."""
    return tuple(BACKENDS)


def check_backend(name: str) -> None:
    """Raise EqsatFuseError unless `name` is a registered backend."""
    if name not in BACKENDS:
        raise EqsatFuseError(f"unknown backend {name!r}; choose one of "
                             f"{', '.join(BACKENDS)}")


def create_backend(name: str, context: BackendContext) -> Backend:
    """The backend registered as `name`, built for `context`."""
    check_backend(name)
    return BACKENDS[name](context)
