"""The Numba backend's compiled kernels in an artifact: which files they are, where Numba looks
for them, and whether this machine can use them.

A generated kernel module (`k_<digest>.py`: the Numba backend names each by the hash of its
source) is compiled with `cache=True`, so Numba keeps its machine code
in an index (`<module>.<function>-<line>.py312.nbi`) and data files (`....1.nbc`) in a cache
folder of its choosing (`__pycache__` beside the module, or under `$NUMBA_CACHE_DIR`). Numba
uses such an entry only for the same source text (the index holds the source's SHA-256), the
same Numba and Python, and the same CPU name and features (`magic_tuple`); otherwise it
compiles. Both files are pickles and hold machine code, so they are copied into the artifact
at save and, at load, written into a fresh folder only after their SHA-256 was checked.

Saving finds the program's modules by lowering its stored plan again into an empty folder: the
backend writes every source the program runs there, reusing the modules this process already
loaded (nothing compiles), and `module_origin` says where each was loaded from, hence where
Numba keeps its cache files.
"""

from __future__ import annotations

import atexit
import platform
import shutil
import sys
from pathlib import Path
from typing import Any

from .. import __version__
from ..errors import ArtifactError

NUMBA_FOLDER = "numba"          # inside the artifact's kernels/: Numba's cache files


def environment() -> dict[str, Any]:
    """What compiled kernels depend on: the versions and the CPU (as Numba keys its cache)."""
    import llvmlite
    import numba
    import numpy
    from numba.core.registry import cpu_target

    from ..backends.numba.source import RUNTIME_DIGEST
    triple, cpu, features = cpu_target.target_context.codegen().magic_tuple()
    return {"eqsat_fuse": __version__, "runtime": RUNTIME_DIGEST, "numba": numba.__version__,
            "llvmlite": llvmlite.__version__, "numpy": numpy.__version__,
            "python": f"{sys.version_info[0]}.{sys.version_info[1]}{getattr(sys, 'abiflags', '')}",
            "implementation": platform.python_implementation(),
            "cpu": {"triple": triple, "name": cpu, "features": features}}


def mismatches(saved: Any) -> list[str]:
    """How this machine differs from the one the kernels were compiled on, in words (empty: the
    saved machine code is usable here)."""
    if not isinstance(saved, dict):
        return ["the artifact does not say what its kernels were compiled for"]
    here = environment()
    found = []
    for key, what in (("eqsat_fuse", "eqsat-fuse"), ("runtime", "the eqsat-fuse kernel runtime"),
                      ("numba", "Numba"), ("llvmlite", "llvmlite"), ("numpy", "NumPy"),
                      ("python", "Python"), ("implementation", "the Python implementation")):
        if saved.get(key) != here[key]:
            found.append(f"{what} {saved.get(key)} (this is {here[key]})")
    cpu, this = saved.get("cpu") or {}, here["cpu"]
    if not isinstance(cpu, dict) or cpu.get("name") != this["name"] \
            or cpu.get("triple") != this["triple"]:
        name = cpu.get("name") if isinstance(cpu, dict) else None
        found.append(f"CPU {name} (this is {this['name']})")
    elif cpu.get("features") != this["features"]:
        found.append(f"CPU {this['name']} with other features ({_feature_change(cpu, this)})")
    return found


def _feature_change(saved: dict, here: dict) -> str:
    was = set(str(saved.get("features", "")).split(","))
    now = set(here["features"].split(","))
    changed = sorted(f for f in was ^ now if f.startswith("+"))
    return ", ".join(changed[:6]) or "flags"


def cache_folder(module_file: Path) -> Path:
    """The folder where Numba keeps the cache files of the module `module_file` (an existing
    file; the answer depends on its folder only: `__pycache__` beside it, or a subfolder of
    `$NUMBA_CACHE_DIR`), asked of Numba's own cache locator with a probe function defined in
    that file's name."""
    from numba.core.caching import FunctionCache
    namespace: dict[str, Any] = {}
    exec(compile("def probe():\n    pass\n", str(module_file), "exec"), namespace)
    return Path(FunctionCache(namespace["probe"]).cache_path)


def collect(scratch: Path) -> dict[str, Path]:
    """The files to store for the generated modules in `scratch`: relative name in the
    artifact's kernels/ -> file to copy (each source as this process loaded it, and its Numba
    cache files, under numba/)."""
    from ..backends.numba.backend import module_origin
    files: dict[str, Path] = {}
    for source in sorted(scratch.glob("*.py")):
        origin = module_origin(source.name) or source
        if not origin.exists():
            raise ArtifactError(f"cannot save the kernels: {origin}, the module this process "
                                f"loaded kernel {source.stem} from, is gone (was the kernel "
                                f"folder deleted?); compile the model again")
        files[source.name] = source
        stem = source.stem + "."
        for cached in sorted(cache_folder(origin).glob(stem + "*")):
            if cached.suffix in (".nbi", ".nbc"):
                files[f"{NUMBA_FOLDER}/{cached.name}"] = cached
    return files


def place(files: dict[str, bytes], folder: Path) -> Path:
    """Write the checked cache files (kernels/numba/<name> -> contents) where Numba will look
    for the modules the backend generates in `folder`; returns that cache folder. The sources
    are not written: the backend generates each from the plan, and Numba uses a cache entry
    only for a source whose SHA-256 its index records."""
    probe = folder / "_probe.py"
    probe.write_text("")
    try:
        target = cache_folder(probe)
    finally:
        probe.unlink()
    target.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (target / Path(name).name).write_bytes(data)
    return target


def remove_at_exit(folder: Path, cache: Path | None) -> None:
    """Delete a load's private kernel folder and Numba's cache folder for it when the process
    ends: until then the loaded modules' files stay where this process loaded them from, so
    a loaded program can be saved again (`collect` copies them)."""
    for path in (cache, folder):
        if path is not None:
            atexit.register(shutil.rmtree, path, ignore_errors=True)
