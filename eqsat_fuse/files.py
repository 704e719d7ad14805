"""Writing files without losing data: the one way eqsat-fuse writes a file a user named.

The data goes to a temporary file in the target folder, reaches the disk, and is then renamed
into place, so a reader never sees a half-written file and a failed write leaves the old file as
it was. An input of the command (a model, feeds) is never replaced, and an existing file only
when the caller says so (`--force` on the command line, `force=True` in Python).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable, Iterable

from .errors import EqsatFuseError


def write_atomically(path: Path, write: Callable[[BinaryIO], object], *, force: bool,
                     protect: Iterable[Path] = (), force_hint: str = "--force") -> None:
    """Write through a temporary file renamed into place; never replace an input, and replace an
    existing file only with `force`.

    `write(handle)` writes the contents to a binary file handle; `protect` lists the files that
    must never be replaced (the command's inputs); `force_hint` is how the user asks to replace
    an existing file, for the message ("--force" on the command line, "force=True" in Python).
    """
    path = Path(path)
    for other in protect:
        if Path(other).exists() and path.exists() and path.resolve() == Path(other).resolve():
            raise EqsatFuseError(f"{path}: refusing to overwrite the input model")
    if path.exists() and not force:
        raise EqsatFuseError(f"{path}: already exists; pass {force_hint} to replace it")
    if path.parent and not path.parent.exists():
        raise EqsatFuseError(f"{path.parent}: no such folder")
    if path.is_dir():
        raise EqsatFuseError(f"{path}: is a folder; give the name of a file to write")
    try:
        fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent or ".")
    except OSError as exc:
        raise EqsatFuseError(f"{path}: cannot write there: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())      # the new data is on disk before the old name moves
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temp, 0o666 & ~umask)     # as an ordinary new file would be, not mkstemp's 0600
        os.replace(temp, path)
    except OSError as exc:
        Path(temp).unlink(missing_ok=True)
        raise EqsatFuseError(f"{path}: could not write the file: {exc.strerror or exc}") from None
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
