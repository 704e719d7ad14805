"""Writing an artifact folder atomically and reading one back without trusting it.

`write_artifact` writes every file into a temporary folder beside the target, records each
file's size and SHA-256 in manifest.json, and renames the folder into place (an existing
artifact is first renamed aside, then deleted). `read_artifact` reads manifest.json, then
every file it lists, each checked against its size and SHA-256 before anything parses it, and
builds the program by lowering the stored plan with the stored constants: JSON is parsed by
`json`, constants by NumPy's .npy header reader (no pickle), ONNX nodes by protobuf, and the
only code imported is what the Numba backend generates from the plan itself; Numba's cache
files (pickles and machine code) are written for Numba to read only once their hash matched.
"""

from __future__ import annotations

import datetime
import hashlib
import io
import json
import os
import re
import shutil
import tempfile
import time
import uuid
import warnings
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from .. import __version__
from ..errors import ArtifactError, ArtifactWarning
from ..lowering.lower import Program, lower
from ..lowering.program import contiguous
from ..tools.report import KernelReport, Report
from . import kernels
from .codec import plan_from_json, plan_to_json, signature_from_json, signature_to_json
from .reading import FORMAT, FORMAT_VERSION, MANIFEST, PROGRAM, Reading, start_reading



@dataclass
class Loaded:
    """What `read_artifact` gives `eqsat_fuse.load`: the program, its report, its opset."""

    program: Program
    report: Report
    opset: int
    generic: Any = None           # a shape-generic program's `lowering.generic.ShapeGeneric`


# ---- writing -------------------------------------------------------------------------------------

def write_artifact(compiled, path: str | Path, force: bool = False,
                   force_hint: str = "force=True") -> Path:
    """Save `compiled` (a `Compiled`) as an artifact folder at `path`; see the module doc."""
    path = Path(path)
    check_target(path, compiled.source_path, force, force_hint)
    program = compiled.program
    temp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        files: dict[str, dict[str, Any]] = {}
        generic = compiled.generic
        arrays = dict(program.constants)
        if generic is not None:     # the recipe's constants are stored with the program's
            arrays.update(generic.signature.constants)
        stored = _write_constants(arrays, temp, files)
        lowering = {"backend": program.backend, "opset": compiled.opset,
                    "storage_dtype": program.storage_dtype, "threads": program.threads,
                    "numerics": program.report.numerics,
                    "removed_kernels": program.report.removed_kernels}
        document = {"lowering": lowering, "plan": plan_to_json(program.plan),
                    "constants": stored, "memory": _memory(program),
                    "signature": _signature(program), "report": _report_data(compiled.report)}
        if generic is not None:     # a shape-generic program: its symbolic plan and signature
            document["generic"] = {"plan": plan_to_json(generic.plan),
                                   "signature": signature_to_json(generic.signature),
                                   "buckets": [[dict(b), plan_to_json(g.plan), float(cost)]
                                               for b, g, cost in generic.buckets]}
        text = json.dumps(document)
        if program.backend == "numba":
            _write_kernels(json.loads(text), program, temp, files)
        _write(temp / PROGRAM, text.encode(), files, PROGRAM)
        manifest = {"format": FORMAT, "format_version": FORMAT_VERSION,
                    "eqsat_fuse": __version__, "backend": program.backend,
                    "created": datetime.datetime.now(datetime.timezone.utc)
                    .isoformat(timespec="seconds"),
                    "environment": kernels.environment(), "files": files}
        _write(temp / MANIFEST, json.dumps(manifest, indent=1).encode(), None, MANIFEST)
        _move_into_place(temp, path)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    return path


def check_target(path: Path, source: Path | None, force: bool, force_hint: str) -> None:
    """Refuse a target that is (or holds) the model compiled from, an existing path without
    `force`, a folder that is not an artifact, or a missing parent folder."""
    if not path.parent.is_dir():
        raise ArtifactError(f"{path.parent}: no such folder")
    if source is not None and source.exists():
        target, model = path.resolve(), source.resolve()
        if target == model or target in model.parents:
            raise ArtifactError(f"{path}: refusing to overwrite the input model")
    if not (path.exists() or path.is_symlink()):
        return
    if not force:
        raise ArtifactError(f"{path}: already exists; pass {force_hint} to replace it")
    if path.is_dir() and not _is_artifact(path):
        raise ArtifactError(f"{path}: is a folder that is not an eqsat-fuse artifact; refusing "
                            f"to replace it")


def _is_artifact(path: Path) -> bool:
    try:
        return json.loads((path / MANIFEST).read_bytes()).get("format") == FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def _write(path: Path, data: bytes, files: dict | None, name: str) -> None:
    """Write one file to disk (synced) and record its size and SHA-256 under `name`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    if files is not None:
        files[name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


class _Hashing:
    """A binary file that hashes what is written to it (np.save writes arrays through it)."""

    def __init__(self, handle: BinaryIO):
        self.handle, self.sha, self.size = handle, hashlib.sha256(), 0

    def write(self, data) -> int:
        self.sha.update(data)
        self.size += memoryview(data).nbytes
        return self.handle.write(data)


def _write_constants(constants: dict[str, np.ndarray], folder: Path, files: dict
                     ) -> dict[str, dict[str, Any]]:
    """Each folded constant as constants/N.npy; returns name -> {"file", "dtype", "shape"}. A
    dtype the .npy format cannot name (bfloat16, float8: ml_dtypes) is written as raw bytes."""
    (folder / "constants").mkdir()
    stored = {}
    for i, (name, value) in enumerate(constants.items()):
        value = contiguous(value)
        if value.dtype.hasobject:
            raise ArtifactError(f"cannot save constant {name!r}: it holds Python objects "
                                f"(strings); an artifact stores numeric constants only")
        dtype, shape = value.dtype, list(value.shape)
        if np.lib.format.descr_to_dtype(np.lib.format.dtype_to_descr(dtype)) != dtype:
            value = value.reshape(-1).view(np.uint8)
        rel = f"constants/{i}.npy"
        with open(folder / rel, "wb") as handle:
            writer = _Hashing(handle)
            np.lib.format.write_array(writer, value, allow_pickle=False)
            handle.flush()
            os.fsync(handle.fileno())
        files[rel] = {"bytes": writer.size, "sha256": writer.sha.hexdigest()}
        stored[name] = {"file": rel, "dtype": dtype.name, "shape": shape}
    return stored


def _write_kernels(document: dict, program: Program, folder: Path, files: dict) -> None:
    """The Numba kernels' sources and cache files, found by lowering the stored plan again
    (what `read_artifact` will lower) into an empty folder (`kernels` module doc)."""
    scratch = Path(tempfile.mkdtemp(prefix="eqsat-fuse-save-"))
    try:
        again = _lower(document, program.constants, scratch, program.threads)
        if again.report.jit_compiled or again.memory.offsets != program.memory.offsets:
            raise RuntimeError("eqsat-fuse bug: the stored plan does not lower to the program "
                               "it was saved from")
        for rel, source in kernels.collect(scratch).items():
            _write(folder / "kernels" / rel, source.read_bytes(), files, f"kernels/{rel}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _move_into_place(temp: Path, path: Path) -> None:
    """Rename the finished folder to `path`; an existing one is renamed aside first and deleted
    once the new one is in place (put back if the rename fails)."""
    aside = None
    if path.exists() or path.is_symlink():
        aside = path.with_name(f".{path.name}.old-{uuid.uuid4().hex[:8]}")
        os.rename(path, aside)
    try:
        os.rename(temp, path)
    except OSError as why:
        if aside is not None:
            os.rename(aside, path)
        raise ArtifactError(f"{path}: could not write the artifact: {why.strerror or why}") \
            from None
    if aside is not None:
        shutil.rmtree(aside) if aside.is_dir() and not aside.is_symlink() else aside.unlink()
    descriptor = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(descriptor)            # the rename reaches the disk
    finally:
        os.close(descriptor)


def _memory(program: Program) -> dict[str, Any]:
    memory = program.memory
    return {"arena_bytes": memory.arena_bytes, "lower_bound_bytes": memory.lower_bound_bytes,
            "separate_bytes": memory.separate_bytes, "offsets": memory.offsets,
            "sizes": memory.sizes}


def _signature(program: Program) -> dict[str, list]:
    inputs = [[name, list(info.shape), info.dtype] for name, info in program.plan.inputs.items()]
    outputs = [[name, [int(d) for d in shape], np.dtype(dtype).name]
               for name, (shape, dtype) in program._output_info.items()]
    return {"inputs": inputs, "outputs": outputs}


def _report_data(report: Report) -> dict[str, Any]:
    data = report.as_dict()
    data.pop("fusions", None)           # computed from the kernels
    return data


# ---- reading -------------------------------------------------------------------------------------

def read_artifact(path: str | Path, threads: int | None = None, recompile: bool = True,
                  saved_kernels: bool = True, reading: Reading | None = None) -> Loaded:
    """The program saved at `path`, checked and lowered again (module doc); `threads` overrides
    the saved setting; a machine or version the kernels were not compiled for recompiles them
    with an `ArtifactWarning`, or with `recompile=False` raises an `ArtifactError`.
    `saved_kernels=False` compiles the kernels from the plan and hands Numba none of the
    artifact's cache files (pickles and machine code): for an artifact from elsewhere.
    `reading`: the files' reading, when the caller started it (`reading.start_reading`)."""
    started = time.perf_counter() if reading is None else reading.started
    path = Path(path)
    reading = reading or start_reading(path)
    manifest = reading.manifest()
    _warm_up(manifest.get("backend"))
    contents = reading.contents()
    try:
        document = json.loads(contents[PROGRAM])
        lowering = document["lowering"]
        constants = _read_constants(document["constants"], contents)
        plan = plan_from_json(document["plan"], constants)
    except (ValueError, KeyError, TypeError) as why:
        raise ArtifactError(f"{path}: {PROGRAM} is not one this eqsat-fuse reads ({why!r})") \
            from None
    read = time.perf_counter() - started
    problems = []
    if lowering.get("backend") == "numba":
        problems = kernels.mismatches(manifest.get("environment"))
        if problems and not recompile:
            raise ArtifactError(f"{path}: its kernels were compiled for {'; '.join(problems)}; "
                                f"load it with recompile=True to compile them again here")
        if problems:
            warnings.warn(ArtifactWarning(
                f"{path}: its kernels were compiled for {'; '.join(problems)}: compiling them "
                f"again from the stored plan"), stacklevel=3)
    cached = {rel: data for rel, data in contents.items()
              if rel.startswith(f"kernels/{kernels.NUMBA_FOLDER}/")}
    program = _lower(document, constants, None, _threads(path, lowering, threads),
                     cached if saved_kernels and not problems else {}, plan)
    if not saved_kernels:
        problems = [*problems, "saved_kernels=False"]     # compiles are expected, not warned
    strict = not problems and manifest.get("eqsat_fuse") == __version__ \
        and program.threads == int(lowering["threads"])
    _check_program(path, document, program, strict, problems)
    report = _report(document["report"], path)
    report.backend_report = program.report.as_dict()
    total = time.perf_counter() - started
    # the compile's stage timings, then the load's: reading and checking the files (the
    # weights, mostly), lowering (code generation, Numba's cache), and the whole load
    report.timings = {**report.timings, "load-read": read, "load-lower": total - read,
                      "load": total}
    report.notes = [*report.notes, f"loaded from the artifact {path} (saved "
                    f"{manifest.get('created')} by eqsat-fuse {manifest.get('eqsat_fuse')})"]
    return Loaded(program, report, int(lowering["opset"]),
                  _generic(document, constants, program, path))


def _generic(document: dict, constants: dict[str, np.ndarray], program: Program, path: Path):
    """A shape-generic artifact's `ShapeGeneric`: its symbolic plan and signature, the loaded
    program serving the representative shape; new shapes are lowered as at compile time."""
    stored = document.get("generic")
    if stored is None:
        return None
    from ..lowering.generic import ShapeGeneric
    try:
        plan = plan_from_json(stored["plan"], constants)
        signature = signature_from_json(stored["signature"], constants)
    except (KeyError, TypeError) as why:
        raise ArtifactError(f"{path}: its symbolic plan is not one this eqsat-fuse reads "
                            f"({why!r})") from None
    lowering = document["lowering"]
    generic = ShapeGeneric(plan, signature, dict(
        backend=lowering["backend"], opset=int(lowering["opset"]),
        storage_dtype=lowering["storage_dtype"], cache_dir=None, threads=program.threads,
        numerics=lowering["numerics"]))
    binding = signature.representative
    generic.programs[generic.key(binding)] = (program, signature.derive(binding))
    try:
        for bucket, stored_plan, cost in stored.get("buckets", []):
            if not isinstance(bucket, dict) or set(bucket) != set(binding):
                raise ValueError(f"bucket {str(bucket)[:60]}")
            generic.add_bucket({str(k): int(v) for k, v in bucket.items()},
                               plan_from_json(stored_plan, constants), float(cost))
    except (TypeError, ValueError) as why:
        raise ArtifactError(f"{path}: its shape buckets are not ones this eqsat-fuse reads "
                            f"({why!r})") from None
    return generic


def _warm_up(backend: Any) -> None:
    """Load `backend`'s runtime (`backends.warm_up`) while the reading thread reads and hashes
    the files (docs/artifacts.md). Whatever fails here is left to lowering, which does it
    again and reports it."""
    from ..backends import warm_up
    try:
        if isinstance(backend, str):
            warm_up(backend)
    except Exception:            # noqa: BLE001 - redone (and reported) by lowering
        pass


def _read_constants(stored: dict[str, Any], contents: dict[str, bytes]
                    ) -> dict[str, np.ndarray]:
    """Each constant from its checked .npy bytes: the header read by NumPy's reader (no
    pickle: object arrays are refused), the data viewed in place, read-only."""
    values = {}
    for name, entry in stored.items():
        data = contents.get(entry["file"])
        if data is None:
            raise ArtifactError(f"constant {name!r}: {entry['file']} is not in the manifest")
        array = _npy(data, entry["file"])
        if array.dtype.name != entry["dtype"]:         # raw bytes of an ml_dtypes dtype
            array = array.view(_extension_dtype(entry["dtype"], entry["file"]))
        values[name] = array.reshape([int(d) for d in entry["shape"]])
    return values


# the header `np.lib.format.write_array` writes for a C-ordered array of a plain dtype: read by
# this pattern (a quarter of a millisecond less per file than NumPy's reader, which parses the
# header as a Python literal); any other header goes to NumPy's reader
_NPY_HEADER = re.compile(rb"\{'descr': '([<>|=][a-z]\d{1,2})', 'fortran_order': False, "
                         rb"'shape': \(((?:\d+, ?)*\d*)\), \} *\n")


def _npy(data: bytes, rel: str) -> np.ndarray:
    shape, dtype, offset = _npy_header(data, rel)
    if dtype.hasobject:
        raise ArtifactError(f"{rel}: holds an object or Fortran-ordered array, which an "
                            f"artifact never does")
    count = int(np.prod(shape, dtype=np.int64))
    if len(data) - offset != count * dtype.itemsize:
        raise ArtifactError(f"{rel}: its data does not fill its shape {list(shape)}")
    return np.frombuffer(data, dtype=dtype, count=count, offset=offset).reshape(shape)


def _npy_header(data: bytes, rel: str) -> tuple[tuple[int, ...], np.dtype, int]:
    """A .npy file's shape, dtype and data offset, from its header (C order only)."""
    if data[:8] == b"\x93NUMPY\x01\x00" and len(data) >= 10:
        end = 10 + int.from_bytes(data[8:10], "little")
        match = _NPY_HEADER.fullmatch(data, 10, end)
        if match:
            try:
                dtype = np.dtype(match[1].decode())
            except TypeError:
                raise ArtifactError(f"{rel}: not a .npy array (dtype {match[1]!r})") from None
            return tuple(int(d) for d in match[2].split(b",") if d.strip()), dtype, end
    header = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(header)
        read = {(1, 0): np.lib.format.read_array_header_1_0,
                (2, 0): np.lib.format.read_array_header_2_0}[version]
        shape, fortran, dtype = read(header)
    except (ValueError, KeyError, TypeError) as why:
        raise ArtifactError(f"{rel}: not a .npy array ({why})") from None
    if fortran:
        raise ArtifactError(f"{rel}: holds an object or Fortran-ordered array, which an "
                            f"artifact never does")
    return shape, dtype, header.tell()


def _extension_dtype(name: str, rel: str) -> np.dtype:
    """A dtype .npy cannot name, by its ml_dtypes name (looked up, never evaluated)."""
    import ml_dtypes
    dtype = getattr(ml_dtypes, str(name), None)
    if not isinstance(dtype, type) or not issubclass(dtype, np.generic):
        raise ArtifactError(f"{rel}: unknown dtype {str(name)[:40]!r}")
    return np.dtype(dtype)


def _threads(path: Path, lowering: dict, threads: int | None) -> int | None:
    """The thread count to lower for: the caller's, else the saved one if this process's Numba
    pool has that many (else the default here, with a warning: kernels split for another
    thread count are compiled again)."""
    from ..threads import pool_size
    if threads is not None:
        return threads
    saved = int(lowering["threads"])
    if saved <= pool_size():
        return saved
    warnings.warn(ArtifactWarning(f"{path}: saved for {saved} threads, more than this "
                                  f"process's Numba pool of {pool_size()}: running on the "
                                  f"default"), stacklevel=4)
    return None


def _lower(document: dict, constants: dict[str, np.ndarray], folder: Path | None,
           threads: int | None, cached: dict[str, bytes] | None = None, plan=None) -> Program:
    """Lower the stored plan as the artifact says (backend, opset, storage dtype, numerics),
    the Numba kernels generated into `folder` (a private temporary one when None, with the
    `cached` Numba files placed for them, deleted when the process ends)."""
    lowering = document["lowering"]
    if plan is None:
        plan = plan_from_json(document["plan"], constants)
    own = folder is None and lowering["backend"] == "numba"
    if own:
        folder = Path(tempfile.mkdtemp(prefix="eqsat-fuse-load-"))
    cache = None
    try:
        if own and cached:
            cache = kernels.place(cached, folder)
        program = lower(plan, lowering["backend"], int(lowering["opset"]),
                        storage_dtype=lowering["storage_dtype"], cache_dir=folder,
                        threads=threads, reuse_inline=False, numerics=lowering["numerics"])
    finally:
        if own:
            kernels.remove_at_exit(folder, cache)
    program.report.removed_kernels = int(lowering.get("removed_kernels", 0))
    return program


def _check_program(path: Path, document: dict, program: Program, strict: bool,
                   problems: list[str]) -> None:
    """The loaded program is the saved one: its signature, and (`strict`: same eqsat-fuse,
    machine and thread count) its memory plan; kernels compiled although nothing said they
    would be are warned about."""
    if _signature(program) != document["signature"]:
        raise ArtifactError(f"{path}: the stored plan does not have the saved inputs and outputs")
    memory = document["memory"]
    if strict and (
            program.memory.arena_bytes != memory["arena_bytes"]
            or program.memory.offsets != memory["offsets"]):
        raise ArtifactError(f"{path}: the stored plan does not lower to the saved memory plan")
    compiled = program.report.jit_compiled
    if compiled and not problems:
        warnings.warn(ArtifactWarning(
            f"{path}: {compiled} kernel(s) were not in the artifact's cache and were compiled "
            f"({program.report.jit_seconds:.1f} s of JIT)"), stacklevel=4)


def _report(data: Any, path: Path) -> Report:
    """The saved report as a `Report` (keys this version does not know are left out)."""
    try:
        known = {f.name for f in fields(Report)}
        values = {k: v for k, v in data.items() if k in known}
        values["kernels"] = [KernelReport(**k) for k in values.get("kernels", [])]
        return Report(**values)
    except (TypeError, AttributeError) as why:
        raise ArtifactError(f"{path}: the saved report is not one this eqsat-fuse reads "
                            f"({why})") from None
