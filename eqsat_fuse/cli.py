"""The `eqsat-fuse` command line: demo, optimize, run, verify, rules check, compare, calibrate.

A mistake in what the user gave (a bad model, rule file, cost file or feed) ends with one line
`eqsat-fuse: error: ...` naming the file, line or input, and exit status 2; a mismatch found by
`verify` exits 1, and so does an unsound rule found by `rules check`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

from . import __version__
from .backends import BACKENDS
from .errors import EqsatFuseError
from .files import write_atomically  # noqa: F401  (also imported from here)
from .lowering.storage import LOWERED_STORAGE_DTYPES
from .saturation.limits import parse_hard_limits
from .saturation.saturate import Budgets
from .tools import compare_stats as timing


def _input_shape(text: str) -> tuple[str, tuple[int, ...]]:
    name, sep, dims = text.rpartition("=")
    if not sep or not name:
        hint = " (give MODEL before --input-shape)" if text.endswith(".onnx") else ""
        raise argparse.ArgumentTypeError(f"expected NAME=D1,D2,..., got {text!r}{hint}")
    try:
        shape = tuple(int(d) for d in dims.split(",") if d.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"dims of {name!r} must be integers: {dims!r}") from None
    return name, shape


def _dim_binding(text: str) -> list[tuple[str, int | list[int]]]:
    """`--dim NAME=VALUE[,VALUE...][,NAME=VALUE...]`: the value extraction prices a symbol at,
    or several (shape buckets: `seq=1,128,2048`)."""
    out: list[tuple[str, list[int]]] = []
    for item in text.split(","):
        name, sep, value = item.strip().rpartition("=")
        if not sep and not out:
            raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {item!r}")
        if sep and not name:
            raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {item!r}")
        try:
            number = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"the value of {name or out[-1][0]!r} must be a "
                                             f"whole number: {value!r}") from None
        if sep:
            out.append((name, [number]))
        else:
            out[-1][1].append(number)
    return [(name, values[0] if len(values) == 1 else values) for name, values in out]


def _thread_count(text: str) -> int | str:
    """`--threads N` as given: a whole number, else the text itself; `main` checks it before
    any command runs, so every wrong value is the same one line as `compile(threads=...)`'s."""
    try:
        return int(text)
    except ValueError:
        return text


def _add_compile_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", default="cpu",
                        help="cost model: a shipped target name or a .toml file (default: cpu)")
    parser.add_argument("--rules", nargs="+", default=[], metavar="FILE",
                        help="extra rule files, loaded after the shipped ones")
    parser.add_argument("--extractor", default="greedy-dag", choices=["tree", "greedy-dag", "ilp"],
                        help="tree (bottom-up, optimal for tree cost), greedy-dag (DAG-aware "
                             "heuristic, the default) or ilp (the exact optimum, HiGHS)")
    parser.add_argument("--objective", default="latency", choices=["latency", "energy"],
                        help="what extraction minimizes under the target (default: latency)")
    parser.add_argument("--ilp-seconds", type=float, default=30.0, metavar="S",
                        help="time limit of the ILP extractor (default 30); on a stop the report "
                             "gives the gap to optimal")
    parser.add_argument("--backend", default=None, choices=list(BACKENDS),
                        help="numba (the default: each fused kernel JIT-compiled, cached on "
                             "disk) or numpy; $EQSAT_FUSE_BACKEND sets another default")
    parser.add_argument("--storage-dtype", choices=list(LOWERED_STORAGE_DTYPES), default=None,
                        help="dtype the intermediates are stored in (computed in float32); "
                             "default: the target's storage_dtype (edge-npu: float16, which "
                             "verify holds to float16's tolerances)")
    parser.add_argument("--threads", type=_thread_count, default=None, metavar="N",
                        help="the most threads the program runs on: Numba's parallel loops "
                             "(BLAS single-threaded inside them) or the NumPy backend's BLAS; "
                             "a run uses fewer while other processes keep cores busy "
                             "(default: the cores this process may use)")
    parser.add_argument("--fast-math", action="store_true",
                        help="like -ffast-math: also run the rules tagged ':numerics fast' and "
                             "compile kernels with fast-math flags; results may then differ in "
                             "NaN, infinities and signed zeros (default: exact, docs/numerics.md)")
    parser.add_argument("--input-shape", action="extend", nargs="+", type=_input_shape,
                        default=[], metavar="NAME=D1,D2,...",
                        help="static shapes to compile for, one or more per flag: a dynamic "
                             "input's (the program then takes that shape only), or a new size "
                             "for a static one (the model is re-sized, like onnxsim's "
                             "--overwrite-input-shape); without it, open dims stay symbolic")
    parser.add_argument("--dim", action="extend", nargs="+", type=_dim_binding, default=[],
                        metavar="NAME=VALUE",
                        help="the value of a symbolic dim that extraction's cost model prices "
                             "(repeatable, several per flag or comma-separated, like "
                             "onnxruntime's free-dimension overrides; default: 1 for a leading "
                             "dim, 128 for any other); the program still runs at every value. "
                             "Several values, seq=1,128,2048, make shape buckets: a program "
                             "extracted for each, a run taking the smallest bucket that fits")
    parser.add_argument("--max-iterations", type=int, default=Budgets.iterations,
                        help=f"saturation iteration budget (default {Budgets.iterations}; "
                             f"0 runs no rule)")
    parser.add_argument("--max-nodes", type=int, default=Budgets.nodes,
                        help=f"e-graph size budget in e-nodes (default {Budgets.nodes})")
    parser.add_argument("--max-seconds", type=float, default=Budgets.seconds,
                        help=f"saturation wall-time budget (default {Budgets.seconds:g})")
    parser.add_argument("--hard-limits", nargs="?", const="default", default=None,
                        type=parse_hard_limits, metavar="memory_mb=N,seconds=S",
                        help="saturate in a child process that cannot use more than N MB or run "
                             "longer than S seconds (default 4096 MB, 300 s); on a limit, go on "
                             "from the last completed iteration")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")


def _compile(args, model):
    from .pipeline import compile as compile_model

    progress = None if args.quiet else _progress
    return compile_model(model, target=args.target, backend=args.backend,
                         extractor=args.extractor, rules=args.rules,
                         input_shapes=dict(args.input_shape) or None,
                         budgets=Budgets(args.max_iterations, args.max_nodes, args.max_seconds),
                         progress=progress, hard_limits=args.hard_limits,
                         storage_dtype=args.storage_dtype, threads=args.threads,
                         objective=args.objective, ilp_seconds=args.ilp_seconds,
                         numerics="fast" if args.fast_math else "exact",
                         dims=dict(item for group in args.dim for item in group) or None)


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
    protect = [Path(args.model), *(Path(r) for r in args.rules)]
    if args.inline and not args.output:
        raise EqsatFuseError("--inline needs -o OUT.onnx (it says how the model is written)")
    if args.output:            # say what is wrong with OUT.onnx before compiling, not after
        out = Path(args.output)
        if out.exists() and any(p.exists() and out.resolve() == p.resolve() for p in protect):
            raise EqsatFuseError(f"{out}: refusing to overwrite the input model")
        if out.exists() and not args.force:
            raise EqsatFuseError(f"{out}: already exists; pass --force to replace it")
    if args.save:
        from .artifacts.store import check_target

        check_target(Path(args.save), Path(args.model), args.force, "--force")
    if args.report:
        from .tools import html_report

        html_report.check_requirements()        # say what is missing before compiling, not after
        page = Path(args.report)
        if page.exists() and any(p.exists() and page.resolve() == p.resolve() for p in protect):
            raise EqsatFuseError(f"{page}: refusing to overwrite the input model")
        if page.exists() and not args.force:
            raise EqsatFuseError(f"{page}: already exists; pass --force to replace it")
    compiled = _compile(args, args.model)
    report = compiled.report
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        print(report.summary())
        if args.explain or args.explain_facts:
            print(_explain(report, facts=args.explain_facts))
            print(_explain_fusions(compiled))
    if args.output:
        from .tools.export import save_model

        save_model(compiled.to_onnx(inline=args.inline), args.output, force=args.force,
                   protect=protect, force_hint="--force")
        print(f"wrote the optimized model to {args.output}",
              file=sys.stderr if args.json else sys.stdout)
    if args.report:
        html_report.write(compiled, args.report, force=args.force, protect=protect,
                          force_hint="--force")
        print(f"wrote the report to {args.report}", file=sys.stderr if args.json else sys.stdout)
    if args.save:
        from .artifacts import write_artifact

        write_artifact(compiled, args.save, force=args.force, force_hint="--force")
        print(f"wrote the compiled program to {args.save} (eqsat-fuse run {args.save} ...)",
              file=sys.stderr if args.json else sys.stdout)
    return 0


def _explain(report, facts: bool = False) -> str:
    """The rewrites that shaped the program first, then the rewrites that matched; the analysis
    facts that matched (shapes, dtypes, ...: most of the matches) only with `facts`."""
    analysis = report.analysis_facts()

    def counted(counts: dict[str, int]) -> list[str]:
        return [f"  {count:6d}  {rule}" for rule, count in
                sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))] or ["  (none)"]

    rewrites = {r: c for r, c in report.matches_per_rule.items() if r not in analysis}
    lines = ["\nrules that shaped the extracted program (places in their output form):",
             *counted({r: c for r, c in report.rules_in_program.items() if r not in analysis})]
    hidden = sum(1 for r in report.matches_per_rule if r in analysis)
    note = "" if facts or not hidden else (f"; {hidden} analysis rules not shown: "
                                            f"--explain-facts lists them")
    lines += [f"\nrewrites that matched (e-graph{note}):", *counted(rewrites)]
    if facts:
        lines += ["\nanalysis facts that matched (shapes, dtypes, fusability):",
                  *counted({r: c for r, c in report.matches_per_rule.items() if r in analysis})]
    lines.append("\nkernels (predicted cost):")
    for k in report.kernels:
        lines.append(f"  {k.name:>5}  {k.predicted_us:9.2f} us  {k.kind:7}  {'+'.join(k.ops):40} "
                     f"-> {k.output} {k.shape}")
    return "\n".join(lines)


def _explain_fusions(compiled) -> str:
    """Each fused kernel: the best program's cost with it, and without it (re-extracted with the
    kernel split back at its Mat boundaries)."""
    values = compiled.extraction.fusion_values()
    unit = "us" if compiled.report.objective == "latency" else "uJ"
    lines = [f"\nwhat each fusion is worth ({compiled.report.objective}; best program with it "
             f"and without it):"]
    names = {k.output: k.name for k in compiled.report.kernels}
    plan_names = {k.eclass: names.get(k.output, k.name) for k in compiled.plan.kernels}
    for value in sorted(values, key=lambda v: -(v.saving if v.saving is not None else 1e300)):
        name = plan_names.get(value.eclass, f"class {value.eclass}")
        without = ("no legal program" if value.without_cost is None
                   else f"{value.without_cost:10.2f} {unit} ({value.saving:+.2f})")
        lines.append(f"  {name:>5}  {'+'.join(value.ops):40} with {value.with_cost:10.2f} {unit}"
                     f", without {without}")
    if not values:
        lines.append("  (no fused kernels)")
    return "\n".join(lines)


def cmd_calibrate(args) -> int:
    from .tools.calibrate import main as calibrate_main

    return calibrate_main(args.output, args.force, quick=args.quick, base=args.base,
                          backend=args.backend)


def cmd_run(args) -> int:
    if args.repeat is not None and args.repeat < 1:
        raise EqsatFuseError(f"--repeat must be a whole number >= 1, got {args.repeat}")
    compiled = _load(args) if Path(args.model).is_dir() else _compile(args, args.model)
    feeds = _load_feeds(args.inputs)
    storage = compiled.report.backend_report.get("storage_dtype", "float32")
    if storage != "float32" and not args.quiet:
        print(f"[eqsat-fuse] intermediates are stored in {storage} (the target's storage_dtype; "
              f"--storage-dtype float32 keeps float32)", file=sys.stderr, flush=True)
    outputs = compiled.run(feeds)
    if args.output:
        write_atomically(Path(args.output), lambda f: np.savez(f, **outputs), force=args.force,
                         protect=[Path(args.model), Path(args.inputs)])
        print(f"wrote {len(outputs)} outputs to {args.output}")
    else:
        for name, value in outputs.items():
            print(f"{name}: shape {list(value.shape)} {value.dtype}\n{value}")
    _print_timings(args, compiled, feeds)
    return 0


def _load(args):
    """`run DIR`: the saved artifact, with --threads; compile options do not apply to it, and
    its warnings (kernels compiled again) are printed as one line each."""
    import warnings

    from .pipeline import load

    defaults = argparse.ArgumentParser()
    _add_compile_options(defaults)
    given = [f"--{dest.replace('_', '-')}" for dest, default in vars(defaults.parse_args([])).items()
             if dest not in ("threads", "quiet") and getattr(args, dest) != default]
    if given:
        raise EqsatFuseError(f"{args.model} is a saved artifact, already compiled: "
                             f"{', '.join(given)} {'does' if len(given) == 1 else 'do'} not apply to it "
                             f"(compile the model again)")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled = load(args.model, threads=args.threads)
    for warning in caught:
        print(f"[eqsat-fuse] warning: {warning.message}", file=sys.stderr, flush=True)
    return compiled


def _print_timings(args, compiled, feeds) -> None:
    """`run --repeat N`: the median and IQR of N whole runs; `--profile`: each kernel alone."""
    from .tools import profile

    if args.repeat is not None:
        print(profile.time_runs(compiled, feeds, args.repeat).summary())
    if args.profile:
        repeat = args.repeat or 10
        rows = profile.profile_kernels(compiled, feeds, repeat=repeat)
        print(profile.profile_table(
            rows, f"profile ({compiled.report.backend} backend, {compiled.program.threads} "
                  f"threads, each kernel alone, medians of {repeat} runs)"))


def cmd_verify(args) -> int:
    compiled = _compile(args, args.model)
    feeds = _load_feeds(args.inputs) if args.inputs else None
    result = compiled.verify(feeds, against=args.against, seed=args.seed, rtol=args.rtol,
                             atol=args.atol, tolerances=dict(args.tol) or None)
    if args.json:
        print(json.dumps({"ok": result.ok, "against": result.against,
                          "storage_dtype": result.storage_dtype, "note": result.note,
                          "outputs": [vars(o) for o in result.outputs]}, indent=2))
    else:
        print(result.summary())
    return 0 if result.ok else 1


def _tolerance(text: str) -> tuple[str, tuple[float, float]]:
    name, sep, values = text.rpartition("=")
    rtol, comma, atol = values.partition(",")
    try:
        if not (sep and name and comma):
            raise ValueError
        return name, (float(rtol), float(atol))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected NAME=RTOL,ATOL, got {text!r}") from None


def cmd_rules_check(args) -> int:
    from .checking.rulecheck import check_rules

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


def _rule_set(text: str) -> tuple[str, list[str]]:
    name, sep, files = text.partition("=")
    if not sep or not name or not files:
        raise argparse.ArgumentTypeError(f"expected NAME=FILE[,FILE...], got {text!r}")
    return name, [f for f in files.split(",") if f]


def cmd_compare(args) -> int:
    from .tools.compare import STRATEGIES, compare, print_progress

    rule_sets = {"shipped": []}
    for name, files in args.rule_set:
        if name in rule_sets:
            raise EqsatFuseError(f"rule set {name!r} is given twice")
        rule_sets[name] = files
    rows = compare(args.models, args.output, strategies=args.strategies or list(STRATEGIES),
                   targets=args.targets, rule_sets=rule_sets, jobs=args.jobs,
                   scheduler=args.scheduler, backend=args.backend, repeats=args.repeats,
                   seed=args.seed, ilp_seconds=args.ilp_seconds, threads=args.threads,
                   spread_limit=args.spread_limit,
                   progress=None if args.quiet else print_progress)
    failed = [r for r in rows if r["status"] != "ok" or r.get("verified") is False]
    noisy = sum(bool(r.get("noisy")) for r in rows)
    print(f"{len(rows)} cells -> {args.output}/results.csv, results.md, metadata.json, plots/"
          + (f"; {len(failed)} failed or did not verify" if failed else "")
          + (f"; {noisy} measured with an IQR above {args.spread_limit:.0%} of the median"
             if noisy else ""))
    return 1 if failed else 0


def _add_demo_command(sub: argparse._SubParsersAction) -> None:
    """The `demo` command."""
    demo = sub.add_parser("demo", help="compile, run and verify the embedded example model",
                          description="Build the embedded example (a small CNN block and a small "
                                      "attention block), compile it, run it, verify it against "
                                      "onnxruntime and print what was fused.")
    _add_compile_options(demo)
    demo.add_argument("--json", action="store_true", help="print the report as JSON")
    demo.set_defaults(func=cmd_demo)


def _add_optimize_command(sub: argparse._SubParsersAction) -> None:
    """The `optimize` command."""
    optimize = sub.add_parser("optimize", help="compile a model and print the report",
                              description="Compile MODEL and print what was fused, the kernel "
                                          "count, the predicted cost and the saturation report.")
    optimize.add_argument("model", help="the ONNX file")
    _add_compile_options(optimize)
    optimize.add_argument("--json", action="store_true", help="print the report as JSON")
    optimize.add_argument("--explain", action="store_true",
                          help="also list the rewrites that shaped the program, those that "
                               "matched, every kernel's cost and what each fusion is worth")
    optimize.add_argument("--explain-facts", action="store_true",
                          help="--explain, and the analysis facts that matched as well "
                               "(shape-*, dtype-*, ...)")
    optimize.add_argument("--report", metavar="OUT.html",
                          help="also write a self-contained HTML report: both graphs as "
                               "pictures, the kernels' costs, the memory plan, the saturation")
    optimize.add_argument("-o", "--output", metavar="OUT.onnx",
                          help="also write the optimized model as ONNX: fused kernels as local "
                               "functions (domain eqsat_fuse), folded constants as initializers")
    optimize.add_argument("--inline", action="store_true",
                          help="with -o: write plain ONNX, each fused kernel's function body "
                               "inlined (no local functions)")
    optimize.add_argument("--save", metavar="DIR",
                          help="also save the compiled program as an artifact folder that "
                               "'eqsat-fuse run DIR' and eqsat_fuse.load run without compiling "
                               "(docs/artifacts.md)")
    optimize.add_argument("--force", action="store_true",
                          help="replace OUT.onnx / OUT.html / DIR if they exist")
    optimize.set_defaults(func=cmd_optimize)


def _add_run_command(sub: argparse._SubParsersAction) -> None:
    """The `run` command."""
    run = sub.add_parser("run", help="compile a model and run it on inputs from a .npz file",
                         description="Compile MODEL (or load the artifact folder that "
                                     "optimize --save wrote) and run it on the arrays in "
                                     "FEEDS.npz (one array per input, by name).")
    run.add_argument("model", help="the ONNX file, or a saved artifact folder")
    run.add_argument("--inputs", required=True, metavar="FEEDS.npz", help="input arrays by name")
    run.add_argument("-o", "--output", metavar="OUT.npz", help="write the outputs here")
    run.add_argument("--force", action="store_true", help="replace OUT.npz if it exists")
    run.add_argument("--repeat", type=int, default=None, metavar="N",
                     help="also time N runs after one warm-up run and print the median and the "
                          "p25-p75 range in ms, with the thread count")
    run.add_argument("--profile", action="store_true",
                     help="also time each kernel alone (medians of --repeat runs, default 10) "
                          "and print it next to its predicted cost, slowest first")
    _add_compile_options(run)
    run.set_defaults(func=cmd_run)


def _add_verify_command(sub: argparse._SubParsersAction) -> None:
    """The `verify` command."""
    verify = sub.add_parser("verify", help="check the compiled model against the original",
                            description="Compile MODEL, run it and the original (onnxruntime or "
                                        "onnx.reference) on the same inputs, compare outputs "
                                        "with per-dtype tolerances (indices of ArgMax, ArgMin "
                                        "and TopK tie-aware) and say per output why it passed "
                                        "or failed. Exits 1 on a mismatch.")
    verify.add_argument("model", help="the ONNX file")
    verify.add_argument("--against", choices=["ort", "reference"], default="ort",
                        help="the oracle (default: onnxruntime)")
    verify.add_argument("--inputs", metavar="FEEDS.npz", help="inputs (default: random, seeded)")
    verify.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    verify.add_argument("--rtol", type=float, metavar="R",
                        help="relative tolerance of every float output (default by dtype: "
                             "float32 1e-3, float64 1e-7, float16 1e-2)")
    verify.add_argument("--atol", type=float, metavar="A",
                        help="absolute tolerance of every float output (default by dtype: "
                             "float32 1e-4, float64 1e-9, float16 1e-2)")
    verify.add_argument("--tol", action="append", type=_tolerance, default=[],
                        metavar="NAME=RTOL,ATOL",
                        help="the tolerance of one output, integer ones too (repeat the flag "
                             "for more); an element passes when |got - want| <= ATOL + RTOL x "
                             "|want|")
    verify.add_argument("--json", action="store_true", help="print the result as JSON")
    _add_compile_options(verify)
    verify.set_defaults(func=cmd_verify)


def _add_rules_command(sub: argparse._SubParsersAction) -> None:
    """`rules` and its actions."""
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


def _add_calibrate_command(sub: argparse._SubParsersAction) -> None:
    """The `calibrate` command."""
    calibrate = sub.add_parser(
        "calibrate", help="measure this machine and write a CPU cost file",
        description="Run micro-benchmarks (memory bandwidth, on-chip size and bandwidth, "
                    "elementwise/MatMul/convolution/reduction rates, the fixed cost of each "
                    "operation and the per-kernel overhead of a backend) on one machine, one "
                    "thread, and write its cost file, to use as --target FILE "
                    "(docs/cost-models.md). Progress goes to stderr; an existing file is "
                    "replaced only with --force. The NumPy backend takes about fifteen seconds, "
                    "the Numba backend about a minute the first time (its kernels are compiled "
                    "and cached) and half that after; calibrate on a quiet machine.")
    calibrate.add_argument("-o", "--output", default="cpu.toml", metavar="FILE",
                           help="where to write the cost file (default: ./cpu.toml)")
    calibrate.add_argument("--force", action="store_true", help="replace FILE if it exists")
    calibrate.add_argument("--base", metavar="FILE",
                           help="cost file to copy the unmeasured keys from (default: the "
                                "shipped cpu.toml)")
    calibrate.add_argument("--quick", action="store_true",
                           help="fewer repeats and smaller arrays (a smoke test, not a figure)")
    calibrate.add_argument("--backend", choices=list(BACKENDS), default=None,
                           help="the backend whose prices to measure (default: the one "
                                "compiles use, numba unless EQSAT_FUSE_BACKEND says otherwise)")
    calibrate.set_defaults(func=cmd_calibrate)


def _add_compare_command(sub: argparse._SubParsersAction) -> None:
    """The `compare` command."""
    compare = sub.add_parser(
        "compare", help="sweep models x strategies x targets x rule sets into a results folder",
        description="Compile every cell of MODEL... x strategies x targets x rule sets, verify it "
                    "against onnxruntime, time it on this machine (the cpu target; other "
                    "targets show their predicted cost only) beside onnxruntime, and write "
                    "DIR/results.csv, DIR/results.md, DIR/metadata.json and DIR/plots/. Cells "
                    "already in DIR are skipped, so an "
                    "interrupted sweep resumes. Strategies: none (the model as written), passes "
                    "(the rules as a fixed-order pass pipeline), eqsat-tree, eqsat-greedy, "
                    "eqsat-ilp (equality saturation with that extractor).")
    compare.add_argument("models", nargs="+", metavar="MODEL", help="ONNX files")
    compare.add_argument("-o", "--output", required=True, metavar="DIR", help="results folder")
    compare.add_argument("--strategies", nargs="+", metavar="S", help="default: all five")
    compare.add_argument("--targets", nargs="+", default=["cpu"], metavar="T",
                         help="targets (default: cpu)")
    compare.add_argument("--rule-set", action="append", type=_rule_set, default=[],
                         metavar="NAME=FILE[,FILE]",
                         help="an extra rule set to compare with the shipped rules")
    compare.add_argument("--jobs", type=int, default=1, help="local processes, one model each "
                         "(default 1; more than one makes measured times noisier)")
    compare.add_argument("--scheduler", metavar="ADDRESS",
                         help="run the models on this Dask distributed scheduler")
    compare.add_argument("--backend", default=None, choices=list(BACKENDS),
                         help="backend to time (default: numba, or $EQSAT_FUSE_BACKEND)")
    compare.add_argument("--repeats", type=int, default=20,
                         help=f"timed runs per measured cell, after {timing.WARMUP_RUNS} "
                              f"warm-up runs, in {timing.BLOCKS} blocks, each after a "
                              f"{timing.BLOCK_PAUSE_S} s pause, taking turns with the blocks of "
                              f"the model's other cells (default 20): median, IQR and a "
                              f"bootstrap 95%% interval of the median")
    compare.add_argument("--spread-limit", type=float, default=0.10, metavar="F",
                         help="warn about a cell whose IQR is above F x its median (default "
                              "0.10)")
    compare.add_argument("--threads", type=_thread_count, default=None, metavar="N",
                         help="threads of the compiled programs and of onnxruntime (default: "
                              "the cores this process may use)")
    compare.add_argument("--seed", type=int, default=0, help="seed of the inputs")
    compare.add_argument("--ilp-seconds", type=float, default=30.0,
                         help="time limit of the ILP extractor per cell")
    compare.add_argument("--quiet", action="store_true", help="no progress on stderr")
    compare.set_defaults(func=cmd_compare)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="eqsat-fuse",
        description="Fuse the operators of an ONNX model by equality saturation, extract the "
                    "cheapest program for a target, run it and check it against the original.")
    parser.add_argument("--version", action="version", version=f"eqsat-fuse {__version__}",
                        help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    _add_demo_command(sub)
    _add_optimize_command(sub)
    _add_run_command(sub)
    _add_verify_command(sub)
    _add_rules_command(sub)
    _add_calibrate_command(sub)
    _add_compare_command(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if getattr(args, "threads", None) is not None:
            from .threads import resolve
            resolve(args.threads)         # a wrong --threads: one line, before any compile
        code = args.func(args)
        sys.stdout.flush()            # a reader that has gone shows here, not at exit
        return code
    except BrokenPipeError:
        # the reader went away (`| head`): stop quietly with a shell's SIGPIPE status, as other
        # command-line tools do, and keep Python from complaining when it flushes at exit
        devnull = os.open(os.devnull, os.O_WRONLY)
        for stream in (sys.stdout, sys.stderr):
            try:
                os.dup2(devnull, stream.fileno())
            except (OSError, ValueError):
                pass
        return 141
    except EqsatFuseError as exc:
        print(f"eqsat-fuse: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("eqsat-fuse: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
