"""Shared set-up for the benchmarks: thread count fixed before NumPy/Numba/ORT load, timing
helpers, and larger models built with onnx.helper (the test models are launch-dominated)."""

from __future__ import annotations

import os
import sys


def exit_on_help(argv: list[str]) -> None:
    """On `-h` / `--help`: print the calling script's docstring (its usage) and exit."""
    if "-h" in argv or "--help" in argv:
        print((sys.modules["__main__"].__doc__ or "").strip())
        sys.exit(0)


def pop_option(argv: list[str], name: str, default: str) -> str:
    """The value after `name` in argv (both removed from it), else `default`."""
    if name not in argv:
        return default
    i = argv.index(name)
    value = argv[i + 1]
    del argv[i:i + 2]
    return value


def set_threads(argv: list[str]) -> int:
    """Read `--threads N` (default 1) and pin every runtime to it; call before importing numpy.
    Answers `--help` first (`exit_on_help`)."""
    exit_on_help(argv)
    threads = int(pop_option(argv, "--threads", "1"))
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                "NUMBA_NUM_THREADS"):
        os.environ[var] = str(threads)
    return threads


def median_seconds(fn, repeat: int = 30, min_time: float = 0.3) -> float:
    """Median wall time of fn() over at least `repeat` runs (and at least `min_time` s)."""
    import time

    import numpy as np
    fn()
    times = []
    start = time.perf_counter()
    while len(times) < repeat or time.perf_counter() - start < min_time:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if len(times) > 2000:
            break
    return float(np.median(times))


def measure(fns: dict, repeat: int = 30, min_time: float = 0.3, max_time: float = 60.0,
            block: int = 1) -> dict[str, float]:
    """Median wall time (s) of each fn, measured round-robin: one call of each per round, so
    the load of a shared machine falls on all of them alike. At least `repeat` rounds and
    `min_time` seconds (at most `max_time` seconds beyond the first `repeat // 3` rounds).

    With `block` > 1 each fn runs `block` times in a row per round, after a 50 ms pause, and
    the first call of each block is not counted. With more than one thread this matters:
    OpenMP's and onnxruntime's workers spin for a while after a parallel run, so a call right
    after another runtime's would share the cores with its spinning threads (the pause), and
    the first call after a pause finds its own workers asleep (not counted). Measured here: a
    one-thread copy ran at 15-21 GB/s right after two-thread runs and 29 GB/s alone; a
    two-thread kernel after a 20 ms pause took 16 or 32 GB/s at random.
    """
    import time

    import numpy as np
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    start = time.perf_counter()
    rounds = 0
    while True:
        for k, fn in fns.items():
            if block > 1:
                time.sleep(0.05)          # the previous runtime's spinning workers go idle
            for i in range(block):
                t0 = time.perf_counter()
                fn()
                if i or block == 1:
                    times[k].append(time.perf_counter() - t0)
        rounds += 1
        elapsed = time.perf_counter() - start
        if rounds >= repeat and elapsed >= min_time:
            break
        if rounds >= max(3, repeat // 3) and elapsed > max_time or rounds > 2000:
            break
    return {k: float(np.median(v)) for k, v in times.items()}


def block_size(threads: int) -> int:
    """The `block` of `measure` at this thread count (see there)."""
    return 3 if threads > 1 else 1


def parallel_copy(threads: int):
    """copy(dst, src) of two flat float32 arrays by `threads` threads, each streaming its share
    through an L1 tile with non-temporal stores (what a copy at that thread count can reach:
    `np.copyto` is one thread). Compiled once here; the bench takes the faster of the two."""
    import numpy as np
    from numba import njit, prange

    from eqsat_fuse.backends.numba import kernels as K
    tile = K.STREAM_TILE

    @njit(parallel=True, error_model="numpy")
    def copy(dst, src, tiles):
        n = src.shape[0]
        per = ((n + threads - 1) // threads + tile - 1) // tile * tile    # whole tiles each
        for t in prange(threads):
            s = min(t * per, n)
            e = min(s + per, n)
            work = tiles[t * tile:(t + 1) * tile]
            for c0 in range(s, e, tile):
                c1 = min(c0 + tile, e)
                for c in range(c0, c1):
                    work[c - c0] = src[c]
                K.stream_out(dst, c0, work, c1 - c0)
        K.sfence()

    tiles = np.empty(threads * tile, np.float32)
    return lambda dst, src: copy(dst.reshape(-1), src.reshape(-1), tiles)


def ort_session(model, threads: int, optimize: bool):
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimize
                                        else ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    data = model.SerializeToString() if hasattr(model, "SerializeToString") else str(model)
    return ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])


def geomean(values):
    import math
    values = [v for v in values if v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


# ---- larger models ----------------------------------------------------------------------------

def _init(rng, shape, scale=0.05):
    import numpy as np
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def encoder_model(layers=2, hidden=768, heads=12, seq=128, ffn=3072, seed=0):
    """A BERT-style encoder (fused LayerNormalization, erf GELU, attention with a scale)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(seed)
    nodes, inits = [], {}
    dh = hidden // heads

    def w(name, shape, scale=0.05):
        inits[name] = _init(rng, shape, scale)
        return name

    def const(name, value):
        inits[name] = np.asarray(value)
        return name

    x = "x"
    const("shape_heads", np.array([1, seq, heads, dh], dtype=np.int64))
    const("shape_back", np.array([1, seq, hidden], dtype=np.int64))
    const("scale", np.array(1.0 / np.sqrt(dh), dtype=np.float32))
    const("sqrt2", np.array(np.sqrt(2.0), dtype=np.float32))
    const("one", np.array(1.0, dtype=np.float32))
    const("half", np.array(0.5, dtype=np.float32))
    for l in range(layers):
        p = f"l{l}_"
        def lin(inp, n_in, n_out, tag):
            nodes.append(helper.make_node("MatMul", [inp, w(p + tag + "_w", (n_in, n_out))],
                                          [p + tag + "_mm"]))
            nodes.append(helper.make_node("Add", [p + tag + "_mm", w(p + tag + "_b", (n_out,))],
                                          [p + tag]))
            return p + tag
        q, k, v = (lin(x, hidden, hidden, t) for t in ("q", "k", "v"))
        for t, perm in ((q, [0, 2, 1, 3]), (k, [0, 2, 3, 1]), (v, [0, 2, 1, 3])):
            nodes.append(helper.make_node("Reshape", [t, "shape_heads"], [t + "_r"]))
            nodes.append(helper.make_node("Transpose", [t + "_r"], [t + "_t"], perm=perm))
        nodes.append(helper.make_node("MatMul", [q + "_t", k + "_t"], [p + "scores"]))
        nodes.append(helper.make_node("Mul", [p + "scores", "scale"], [p + "scaled"]))
        nodes.append(helper.make_node("Softmax", [p + "scaled"], [p + "probs"], axis=-1))
        nodes.append(helper.make_node("MatMul", [p + "probs", v + "_t"], [p + "ctx"]))
        nodes.append(helper.make_node("Transpose", [p + "ctx"], [p + "ctx_t"], perm=[0, 2, 1, 3]))
        nodes.append(helper.make_node("Reshape", [p + "ctx_t", "shape_back"], [p + "ctx_r"]))
        o = lin(p + "ctx_r", hidden, hidden, "o")
        nodes.append(helper.make_node("Add", [o, x], [p + "res1"]))
        nodes.append(helper.make_node("LayerNormalization", [p + "res1", w(p + "ln1_g", (hidden,), 1.0),
                                      w(p + "ln1_b", (hidden,))], [p + "ln1"], axis=-1, epsilon=1e-12))
        f1 = lin(p + "ln1", hidden, ffn, "f1")
        nodes.append(helper.make_node("Div", [f1, "sqrt2"], [p + "g_div"]))
        nodes.append(helper.make_node("Erf", [p + "g_div"], [p + "g_erf"]))
        nodes.append(helper.make_node("Add", [p + "g_erf", "one"], [p + "g_add"]))
        nodes.append(helper.make_node("Mul", [f1, p + "g_add"], [p + "g_mul"]))
        nodes.append(helper.make_node("Mul", [p + "g_mul", "half"], [p + "gelu"]))
        f2 = lin(p + "gelu", ffn, hidden, "f2")
        nodes.append(helper.make_node("Add", [f2, p + "ln1"], [p + "res2"]))
        out = "y" if l == layers - 1 else p + "out"
        nodes.append(helper.make_node("LayerNormalization", [p + "res2", w(p + "ln2_g", (hidden,), 1.0),
                                      w(p + "ln2_b", (hidden,))], [out], axis=-1, epsilon=1e-12))
        x = out
    graph = helper.make_graph(
        nodes, "encoder", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, seq, hidden])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, seq, hidden])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def cnn_model(blocks=2, channels=64, size=56, seed=0):
    """ResNet basic blocks (Conv+BN+ReLU, residual Add) at ImageNet layer-1 size."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(seed)
    nodes, inits = [], {}
    c = channels

    def conv_bn(inp, name, relu):
        inits[name + "_w"] = _init(rng, (c, c, 3, 3), 0.05)
        for k, v in (("s", rng.uniform(0.5, 1.5, c)), ("b", rng.normal(0, 0.1, c)),
                     ("m", rng.normal(0, 0.1, c)), ("v", rng.uniform(0.5, 1.5, c))):
            inits[f"{name}_{k}"] = v.astype(np.float32)
        nodes.append(helper.make_node("Conv", [inp, name + "_w"], [name + "_c"], pads=[1, 1, 1, 1]))
        nodes.append(helper.make_node("BatchNormalization", [name + "_c"] + [f"{name}_{k}" for k in "sbmv"],
                                      [name + "_n"]))
        if relu:
            nodes.append(helper.make_node("Relu", [name + "_n"], [name + "_r"]))
            return name + "_r"
        return name + "_n"

    x = "x"
    for b in range(blocks):
        h = conv_bn(x, f"b{b}a", True)
        h = conv_bn(h, f"b{b}b", False)
        nodes.append(helper.make_node("Add", [h, x], [f"b{b}_add"]))
        out = "y" if b == blocks - 1 else f"b{b}_out"
        nodes.append(helper.make_node("Relu", [f"b{b}_add"], [out]))
        x = out
    shape = [1, c, size, size]
    graph = helper.make_graph(
        nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


# The ops of the elementwise chains, in order: with the transcendental functions of swish and
# GELU, or arithmetic only (memory-bound at any length).
CHAIN_OPS = {
    "mixed": ["Mul", "Add", "Sigmoid", "Mul", "Tanh", "Add", "Erf", "Mul", "Relu", "Sub"],
    "arithmetic": ["Mul", "Add", "Relu", "Sub", "LeakyRelu", "Mul", "Add", "Neg", "Sub", "Relu"],
}


def elementwise_model(n=1 << 22, length=6, seed=0, kind="mixed"):
    """A model dominated by elementwise work: swish / gelu / bias chains on a large tensor
    (`kind` "mixed"), or chains of arithmetic only ("arithmetic")."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    ops = CHAIN_OPS[kind]
    rng = np.random.default_rng(seed)
    inits = {"a": np.float32(1.5) * np.ones(64, np.float32), "b": _init(rng, (64,), 0.1)}
    nodes, x = [], "x"
    for i in range(length):
        op = ops[i % len(ops)]
        out = "y" if i == length - 1 else f"t{i}"
        if op in ("Mul", "Add", "Sub"):
            other = "a" if op == "Mul" else "b"
            if op == "Mul" and i % 3 == 2:
                nodes.append(helper.make_node(op, [x, "x"], [out]))
            else:
                nodes.append(helper.make_node(op, [x, other], [out]))
        else:
            nodes.append(helper.make_node(op, [x], [out]))
        x = out
    shape = [n // 64, 64]
    graph = helper.make_graph(
        nodes, "elementwise", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


BUILTIN = {
    "encoder-base": ("transformer", lambda: encoder_model()),
    "cnn-resnet56": ("cnn", lambda: cnn_model()),
    "elementwise-4M": ("elementwise", lambda: elementwise_model()),
}


def family_of(name: str) -> str:
    if name in BUILTIN:
        return BUILTIN[name][0]
    lowered = name.lower()
    if any(k in lowered for k in ("bert", "gpt", "vit", "llama", "decoder", "swin", "encoder",
                                  "transformer")):
        return "transformer"
    return "cnn"


def load_model(name: str):
    """A builtin model by name, or an ONNX file."""
    import onnx
    if name in BUILTIN:
        return BUILTIN[name][1]()
    if not os.path.isfile(name):
        sys.exit(f"{name}: no such ONNX file, and not a builtin model "
                 f"({', '.join(BUILTIN)})")
    try:
        return onnx.load(name)
    except Exception as exc:          # a truncated or foreign file: say which, not a traceback
        sys.exit(f"{name}: not a readable ONNX model ({type(exc).__name__}: {exc})")


sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
