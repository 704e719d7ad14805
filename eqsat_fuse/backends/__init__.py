"""The code that runs kernels (NumPy and Numba backends, the onnx.reference runner) and the
registry of backends: name -> factory (`backends.base` describes the interface).

Factories import their backend when called, so importing this package loads neither NumPy's
operator table nor Numba (which the Numba backend alone needs).

The default backend is Numba (docs/backends.md gives the measurements behind the choice); the
environment variable EQSAT_FUSE_BACKEND names another default, for a whole process or test
suite. A backend passed explicitly always wins.
"""

from __future__ import annotations

import os

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
BACKENDS: dict[str, BackendFactory] = {"numba": _numba, "numpy": _numpy}
DEFAULT_ENV = "EQSAT_FUSE_BACKEND"


def backend_names() -> tuple[str, ...]:
    """The registered backends' names, in registry order."""
    return tuple(BACKENDS)


def resolve_backend(name: str | None) -> str:
    """The backend to use: `name`, or when it is None the default (EQSAT_FUSE_BACKEND if set,
    else the registry's first); EqsatFuseError for a name that is not registered."""
    if name is None:
        name = os.environ.get(DEFAULT_ENV) or next(iter(BACKENDS))
        if name not in BACKENDS:
            raise EqsatFuseError(f"{DEFAULT_ENV}={name!r} is not a backend; choose one of "
                                 f"{', '.join(BACKENDS)}")
    check_backend(name)
    return name


def check_backend(name: str) -> None:
    """Raise EqsatFuseError unless `name` is a registered backend."""
    if name not in BACKENDS:
        raise EqsatFuseError(f"unknown backend {name!r}; choose one of "
                             f"{', '.join(BACKENDS)}")


def _warm_numba() -> None:
    from .numba.binder import warm_up
    warm_up()


# name -> what loads a backend's runtime ahead of its first program (imports, machine code)
_WARM_UPS = {"numba": _warm_numba}


def warm_up(name: str) -> None:
    """Import and load backend `name`'s runtime now, so that the first program built on it does
    not wait for that (`eqsat_fuse.artifacts` does it while it reads the weights)."""
    if name in _WARM_UPS:
        _WARM_UPS[name]()


def create_backend(name: str, context: BackendContext) -> Backend:
    """The backend registered as `name`, built for `context`."""
    check_backend(name)
    return BACKENDS[name](context)
