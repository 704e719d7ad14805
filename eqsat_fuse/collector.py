"""Python's cyclic garbage collector paused around work that builds many objects that live on.

Lowering a shape-generic program at a new shape builds tens of thousands of containers (plan,
layouts, memory plan, kernel tables) that the kept program holds. With the collector on, every
700 new containers start a collection, every tenth of those also looks at the older ones, and
the oldest generation (every cached program) is walked again and again: in a GPT-2 decode loop
the collector took a median of 23 ms per token (2-55 ms over 11 loops of 12 new shapes, more as
more shapes were kept), against 2 ms (1-15 ms) with the lowering paused (2-core Zen 4, `bench/decode.py`'s model, the collector's own callbacks timing
it). Loading an artifact, once per process, showed no such gain (1.57 against 1.63 s, medians
of 6 fresh processes, within noise), so `load` does not pause it.

`paused()` turns the collector off for the body and back on after it, only if it was on
(a caller's `gc.disable()` is left alone) and only when the last of several overlapping
bodies (two threads) ends. Nothing is lost: objects freed by reference counting go at once
as always, and cycles made meanwhile are collected by the next collection after the body.
"""

from __future__ import annotations

import gc
import threading
from contextlib import contextmanager
from typing import Iterator

_lock = threading.Lock()
_depth = 0
_was_enabled = False


@contextmanager
def paused() -> Iterator[None]:
    """Run the body with the cyclic garbage collector off (see the module doc)."""
    global _depth, _was_enabled
    with _lock:
        if _depth == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _was_enabled:
                gc.enable()
