"""The `eqsat-fuse` command line: demo, optimize, run, verify, rules check.

A mistake in what the user gave (a bad model, rule file, cost file or feed) ends with one line
`eqsat-fuse: error: ...` naming the file, line or input, and exit status 2; a mismatch found by
`verify` exits 1, and so does an unsound rule found by `rules check`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

from .errors import EqsatFuseError
from .saturate import Budgets


def _input_shape(text: str) -> tuple[str, tuple[int, ...]]:
    name, sep, dims = text.rpartition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=D1,D2,..., got {text!r}")
    try:
        shape = tuple(int(d) for d in dims.split(",") if d.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"dims of {name!r} must be integers: {dims!r}") from None
    return name, shape


def _add_compile_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", default="cpu",
                        help="cost model: a shipped target name or a .toml file (default: cpu)")
    parser.add_argument("--rules", nargs="+", default=[], metavar="FILE",
                        help="extra rule files, loaded after the shipped ones")
    parser.add_argument("--extractor", default="greedy-dag", help="extractor (default: greedy-dag)")
    parser.add_argument("--backend", default="numpy", help="numpy (default)")
    parser.add_argument("--input-shape", action="append", type=_input_shape, default=[],
                        metavar="NAME=D1,D2,...", help="static shape for a dynamic input")
    parser.add_argument("--max-iterations", type=int, default=Budgets.iterations,
                        help=f"saturation iteration budget (default {Budgets.iterations})")
    parser.add_argument("--max-nodes", type=int, default=Budgets.nodes,
                        help=f"e-graph size budget in e-nodes (default {Budgets.nodes})")
    parser.add_argument("--max-seconds", type=float, default=Budgets.seconds,
                        help=f"saturation wall-time budget (default {Budgets.seconds:g})")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")


def _compile(args, model):
    from .pipeline import compile as compile_model

    progress = None if args.quiet else _progress
    return compile_model(model, target=args.target, backend=args.backend,
                         extractor=args.extractor, rules=args.rules,
                         input_shapes=dict(args.input_shape) or None,
                         budgets=Budgets(args.max_iterations, args.max_nodes, args.max_seconds),
                         progress=progress)


def _progress(stage: str) -> None:
    print(f"[eqsat-fuse] {stage}...", file=sys.stderr, flush=True)


def _load_feeds(path: str) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as data:
            return {name: data[name] for name in data.files}
    except FileNotFoundError:
        raise EqsatFuseError(f"{path}: no such file") from None
    except (ValueError, OSError) as exc:
        raise EqsatFuseError(f"{path}: not a NumPy .npz file of arrays ({exc})") from None


def write_atomically(path: Path, write, *, force: bool, protect: list[Path] = ()) -> None:
    """Write through a temporary file renamed into place; never replace an input, and replace an
    existing file only with `force`."""
    path = Path(path)
    for other in protect:
        if Path(other).exists() and path.exists() and path.resolve() == Path(other).resolve():
            raise EqsatFuseError(f"{path}: refusing to overwrite the input model")
    if path.exists() and not force:
        raise EqsatFuseError(f"{path}: already exists; pass --force to replace it")
    if path.parent and not path.parent.exists():
        raise EqsatFuseError(f"{path.parent}: no such folder")
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent or ".")
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


# ---- commands ----------------------------------------------------------------------------------

def cmd_demo(args) -> int:
    from .demo import demo_model

    model = demo_model()
    compiled = _compile(args, model)
    report = compiled.report
    result = compiled.verify()
    if args.json:
        print(json.dumps({"report": report.as_dict(), "verified": result.ok}, indent=2))
        return 0 if result.ok else 1
    print("eqsat-fuse demo: a small CNN block and a small attention block, compiled for "
          f"target '{report.target}'\n")
    print(report.summary())
    print(f"\nkernels: {report.nodes_in} ONNX nodes before, {report.kernels_out} kernels after "
          f"({report.views} reshapes/transposes run as views)")
    print(result.summary())
    return 0 if result.ok else 1


def cmd_optimize(args) -> int:
    compiled = _compile(args, args.model)
    report = compiled.report
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        print(report.summary())
        if args.explain:
            print(_explain(report))
    return 0


def _explain(report) -> str:
    lines = ["\nrules that matched (e-graph):"]
    for rule, count in sorted(report.matches_per_rule.items(), key=lambda kv: -kv[1]):
        lines.append(f"  {count:6d}  {rule}")
    lines.append("\nrules that shaped the extracted program (places in their output form):")
    for rule, count in sorted(report.rules_in_program.items(), key=lambda kv: -kv[1]):
        lines.append(f"  {count:6d}  {rule}")
    lines.append("\nkernels (predicted cost):")
    for k in report.kernels:
        lines.append(f"  {k.name:>5}  {k.predicted_us:9.2f} us  {k.kind:7}  {'+'.join(k.ops):40} "
                     f"-> {k.output} {k.shape}")
    return "\n".join(lines)


def cmd_run(args) -> int:
    compiled = _compile(args, args.model)
    feeds = _load_feeds(args.inputs)
    outputs = compiled.run(feeds)
    if args.output:
        write_atomically(Path(args.output), lambda f: np.savez(f, **outputs), force=args.force,
                         protect=[Path(args.model), Path(args.inputs)])
        print(f"wrote {len(outputs)} outputs to {args.output}")
    else:
        for name, value in outputs.items():
            print(f"{name}: shape {list(value.shape)} {value.dtype}\n{value}")
    return 0


def cmd_verify(args) -> int:
    compiled = _compile(args, args.model)
    feeds = _load_feeds(args.inputs) if args.inputs else None
    result = compiled.verify(feeds, against=args.against, seed=args.seed)
    if args.json:
        print(json.dumps({"ok": result.ok, "against": result.against,
                          "outputs": [vars(o) for o in result.outputs]}, indent=2))
    else:
        print(result.summary())
    return 0 if result.ok else 1


def cmd_rules_check(args) -> int:
    from .rulecheck import check_rules

    progress = None
    if not args.json and not args.quiet:
        def progress(result):
            print(f"[eqsat-fuse] {result.status:9} {result.name}", file=sys.stderr, flush=True)
    report = check_rules(args.files or None, examples=args.examples, seed=args.seed,
                         progress=progress)
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        print(report.summary())
    if report.unsound:
        return 1
    return 3 if args.strict and report.unchecked else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="eqsat-fuse",
        description="Fuse the operators of an ONNX model by equality saturation, extract the "
                    "cheapest program for a target, run it and check it against the original.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    demo = sub.add_parser("demo", help="compile, run and verify the embedded example model",
                          description="Build the embedded example (a small CNN block and a small "
                                      "attention block), compile it, run it, verify it against "
                                      "onnxruntime and print what was fused.")
    _add_compile_options(demo)
    demo.add_argument("--json", action="store_true", help="print the report as JSON")
    demo.set_defaults(func=cmd_demo)

    optimize = sub.add_parser("optimize", help="compile a model and print the report",
                              description="Compile MODEL and print what was fused, the kernel "
                                          "count, the predicted cost and the saturation report.")
    optimize.add_argument("model", help="the ONNX file")
    _add_compile_options(optimize)
    optimize.add_argument("--json", action="store_true", help="print the report as JSON")
    optimize.add_argument("--explain", action="store_true",
                          help="also list the rules that matched and every kernel's cost")
    optimize.set_defaults(func=cmd_optimize)

    run = sub.add_parser("run", help="compile a model and run it on inputs from a .npz file",
                         description="Compile MODEL and run it on the arrays in FEEDS.npz "
                                     "(one array per input, by name).")
    run.add_argument("model", help="the ONNX file")
    run.add_argument("--inputs", required=True, metavar="FEEDS.npz", help="input arrays by name")
    run.add_argument("-o", "--output", metavar="OUT.npz", help="write the outputs here")
    run.add_argument("--force", action="store_true", help="replace OUT.npz if it exists")
    _add_compile_options(run)
    run.set_defaults(func=cmd_run)

    verify = sub.add_parser("verify", help="check the compiled model against the original",
                            description="Compile MODEL, run it and the original (onnxruntime or "
                                        "onnx.reference) on the same inputs, compare outputs "
                                        "with per-dtype tolerances. Exits 1 on a mismatch.")
    verify.add_argument("model", help="the ONNX file")
    verify.add_argument("--against", choices=["ort", "reference"], default="ort",
                        help="the oracle (default: onnxruntime)")
    verify.add_argument("--inputs", metavar="FEEDS.npz", help="inputs (default: random, seeded)")
    verify.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    verify.add_argument("--json", action="store_true", help="print the result as JSON")
    _add_compile_options(verify)
    verify.set_defaults(func=cmd_verify)

    rules = sub.add_parser("rules", help="work with rule files (check their soundness)",
                           description="Work with rule files.")
    rules_sub = rules.add_subparsers(dest="rules_command", metavar="ACTION")
    rules_sub.required = True
    check = rules_sub.add_parser(
        "check", help="check that every rule's two sides compute the same tensor",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="For every rule in FILE... (default: every shipped rule file), draw shapes, "
                    "attributes and values\nthat satisfy its conditions (hypothesis), evaluate "
                    "both sides with the NumPy backend and\ncompare them. User files are loaded "
                    "after the shipped ones, as compilation loads them.",
        epilog="exit status:\n"
               "  0  no rule is unsound (rules that could not be checked are listed as "
               "UNCHECKED,\n     not failures; add --strict to fail on them)\n"
               "  1  a rule is unsound: its name, file:line and a counterexample are printed\n"
               "  2  a rule file is malformed (file:line:column) or cannot be read\n"
               "  3  with --strict: no rule is unsound but some could not be checked")
    check.add_argument("files", nargs="*", metavar="FILE",
                       help="rule files to check (default: the shipped rules)")
    check.add_argument("--examples", type=int, default=50, metavar="N",
                       help="examples per rule (default: 50)")
    check.add_argument("--seed", type=int, default=0, help="seed of the examples (default: 0)")
    check.add_argument("--json", action="store_true", help="print the report as JSON")
    check.add_argument("--strict", action="store_true",
                       help="exit 3 when some rule could not be checked")
    check.add_argument("--quiet", action="store_true", help="no progress on stderr")
    check.set_defaults(func=cmd_rules_check)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except EqsatFuseError as exc:
        print(f"eqsat-fuse: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("eqsat-fuse: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
