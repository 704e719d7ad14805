"""Where the Numba backend keeps machine code between processes: the generated kernel modules
(`default_cache_dir`; Numba writes each one's machine code beside it) and the machine code of
the hand-written runtime that Numba does not cache, the GEMM microkernels in LLVM IR
(`runtime_cache_dir`, `read_object`, `write_object`, `load_ir`)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

CACHE_ENV = "EQSAT_FUSE_CACHE_DIR"


def _user_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "eqsat-fuse"


def default_cache_dir() -> Path:
    """`$EQSAT_FUSE_CACHE_DIR`, else the user cache folder (XDG) / eqsat-fuse / kernels."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env)
    return _user_cache() / "kernels"


def runtime_cache_dir() -> Path:
    """Where the runtime's own machine code goes: beside Numba's cache of the hand-written
    kernels when `$NUMBA_CACHE_DIR` names one (so an empty one means a new machine for both),
    else the user cache folder / eqsat-fuse / runtime."""
    numba_cache = os.environ.get("NUMBA_CACHE_DIR")
    if numba_cache:
        return Path(numba_cache) / "eqsat_fuse_runtime"
    return _user_cache() / "runtime"


def read_object(path: Path) -> bytes | None:
    """The object code stored at `path` by `write_object`, or None when the file is missing or
    does not match the SHA-256 stored with it (truncated, edited)."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    digest, code = data[:32], data[32:]
    return code if code and hashlib.sha256(code).digest() == digest else None


def write_object(path: Path, code: bytes) -> None:
    """Store object code with its SHA-256, atomically; a folder that cannot be written leaves
    the next process to compile again."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(hashlib.sha256(code).digest() + code)
        os.replace(tmp, path)
    except OSError:
        pass


def load_ir(source: str, name: str, symbols: tuple[str, ...]):
    """Machine code for LLVM IR `source` on this CPU (compiled once per machine, kept in
    `runtime_cache_dir` keyed by the IR, the CPU and llvmlite's version; each process loads the
    object, about a millisecond), its `symbols` registered for compiled code to call by name.
    Returns the engine, which the caller keeps (it keeps the machine code mapped)."""
    import llvmlite
    import llvmlite.binding as llvm
    import numba  # noqa: F401  (initializes LLVM's native target the way Numba does)
    cpu, features = llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten()
    machine = llvm.Target.from_default_triple().create_target_machine(cpu=cpu, features=features,
                                                                      opt=3)
    key = hashlib.sha256("\0".join((source, cpu, features, llvmlite.__version__))
                         .encode()).hexdigest()[:32]
    path = runtime_cache_dir() / f"{name}-{key}.o"
    code = read_object(path)
    if code is None:
        module = llvm.parse_assembly(source)
        module.verify()
        builder = llvm.create_pass_builder(machine, llvm.create_pipeline_tuning_options(3))
        builder.getModulePassManager().run(module, builder)
        code = machine.emit_object(module)
        write_object(path, code)
    engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), machine)
    engine.add_object_file(llvm.ObjectFileRef.from_data(code))
    engine.finalize_object()
    for symbol in symbols:
        llvm.add_symbol(symbol, engine.get_function_address(symbol))
    return engine
