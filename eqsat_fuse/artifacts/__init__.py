"""Saved artifacts: a compiled program written to a folder (`Compiled.save`) and run again in
another process without saturation, extraction or JIT (`eqsat_fuse.load`).

The folder (format in docs/artifacts.md):

    manifest.json        format and version, the versions and CPU the kernels were compiled
                         for, and every other file's size and SHA-256
    program.json         the kernel plan (`codec`), lowering's options, the memory plan, the
                         signature and the report
    constants/N.npy      the folded constants (read with no pickle)
    kernels/*.py         the Numba backend's generated sources, and under kernels/numba/
                         Numba's cache files of their machine code (`kernels`)

Loading checks every file against the manifest before anything reads it, then lowers the
stored plan again with the stored constants: memory planning and code generation are fast, and
the Numba backend finds each kernel's machine code in the checked cache files instead of
compiling it. `store` writes and reads the folder, `reading` reads and checks its files (in a
thread, and light enough to start before the rest is imported), `codec` turns the plan into
JSON and back, `kernels` finds, checks and places the Numba cache files.
"""

__all__ = ["FORMAT_VERSION", "Loaded", "read_artifact", "write_artifact"]


def __getattr__(name: str):
    """The package's names, imported on first use: `eqsat_fuse.load` imports `reading` first
    and starts it before `store` imports lowering."""
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from . import store
    return getattr(store, name)
