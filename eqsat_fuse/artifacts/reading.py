"""Reading an artifact's files without trusting them: manifest.json parsed and checked, then
every file it lists, each checked against its recorded size and SHA-256 before anything parses
it.

This module imports nothing of the compiler, so `eqsat_fuse.load` starts reading in a thread
(`start_reading`) before it imports lowering and the backend: reading and hashing release the
interpreter, and the imports and the backend's warm-up happen meanwhile (docs/artifacts.md).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from concurrent.futures import Future
from pathlib import Path, PurePosixPath
from typing import Any

from .. import __version__
from ..errors import ArtifactError

FORMAT = "eqsat-fuse-artifact"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
PROGRAM = "program.json"
_AREAS = ("constants", "kernels")      # the folders a manifest may name files in


class Reading:
    """The reading of one artifact in a thread: `manifest()` and `contents()` wait for their
    part and raise the `ArtifactError` the thread met (each a `Future`'s result)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.started = time.perf_counter()
        self._manifest: Future = Future()
        self._contents: Future = Future()
        threading.Thread(target=self._run, name="eqsat-fuse-read", daemon=True).start()

    def _run(self) -> None:
        try:
            manifest = read_manifest(self.path)
        except BaseException as why:       # noqa: BLE001 - handed to the caller
            self._manifest.set_exception(why)
            self._contents.set_exception(why)
            return
        self._manifest.set_result(manifest)
        try:
            self._contents.set_result(read_files(self.path, manifest["files"]))
        except BaseException as why:       # noqa: BLE001 - handed to the caller
            self._contents.set_exception(why)

    def manifest(self) -> dict[str, Any]:
        return self._manifest.result()

    def contents(self) -> dict[str, bytes]:
        return self._contents.result()


def start_reading(path: str | Path) -> Reading:
    """Start reading the artifact at `path` in a thread."""
    return Reading(Path(path))


def read_manifest(path: Path) -> dict[str, Any]:
    """manifest.json, parsed and checked: our format, a version this code reads, a file list."""
    if not path.exists():
        raise ArtifactError(f"{path}: no such artifact")
    if not path.is_dir():
        raise ArtifactError(f"{path}: not an eqsat-fuse artifact (an artifact is a folder "
                            f"that Compiled.save or optimize --save wrote)")
    try:
        manifest = json.loads((path / MANIFEST).read_bytes())
    except FileNotFoundError:
        raise ArtifactError(f"{path}: not an eqsat-fuse artifact (no {MANIFEST})") from None
    except ValueError as why:
        raise ArtifactError(f"{path}: {MANIFEST} is damaged or truncated ({why})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ArtifactError(f"{path}: {MANIFEST} is not an eqsat-fuse artifact manifest")
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise ArtifactError(
            f"{path}: artifact format version {version!r} (saved by eqsat-fuse "
            f"{manifest.get('eqsat_fuse')}); this eqsat-fuse {__version__} reads version "
            f"{FORMAT_VERSION}: compile the model again")
    if not isinstance(manifest.get("files"), dict) or PROGRAM not in manifest["files"]:
        raise ArtifactError(f"{path}: {MANIFEST} lists no {PROGRAM}")
    return manifest


def read_files(path: Path, listed: dict[str, Any]) -> dict[str, bytes]:
    """Every listed file's contents, each checked against its recorded size and SHA-256."""
    contents = {}
    for rel, record in listed.items():
        parts = PurePosixPath(rel).parts
        if not (rel == PROGRAM or (len(parts) >= 2 and parts[0] in _AREAS)) \
                or ".." in parts or PurePosixPath(rel).is_absolute() or not isinstance(record, dict):
            raise ArtifactError(f"{path}: {MANIFEST} names an unexpected file {rel!r}")
        try:
            data = (path / rel).read_bytes()
        except OSError:
            raise ArtifactError(f"{path}: {rel} is missing or unreadable") from None
        if len(data) != record.get("bytes") or \
                hashlib.sha256(data).hexdigest() != record.get("sha256"):
            raise ArtifactError(f"{path}: {rel} is not the file that was saved (its size or "
                                f"SHA-256 differs from the manifest's): the artifact was "
                                f"modified or damaged; refusing to load it")
        contents[rel] = data
    return contents
