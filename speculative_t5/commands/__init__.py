"""`speculative-t5` command line, launched the T5X way.

  speculative-t5 demo [--family t5|gpt2] [--drafts] [--output_dir D] [--num_examples N] [--gamma G] [--temperature T]
  speculative-t5 convert --from PATH --to PATH [--format native|hf] [--dtype bfloat16]
  speculative-t5 decode --target PATH [--draft PATH] (--input_file F --output F.jsonl | --prompt TEXT)
      [--vocab spiece.model] [--gamma 4] [--temperature 0] [--top_k 0] [--top_p 1]
      [--verification token|block] [--tree 3,2,1 [--tree_children drawn|top_k]]
      [--beam_size 4 [--alpha 0.6] [--beam_outputs K] [--beam_paths P]] ...
  speculative-t5 fit_bigram --input_file refs.tsv --target PATH --output bigram.npz  (then --draft bigram:bigram.npz)
  speculative-t5 train --gin_file=configs/demo_target.gin [--gin.train.steps=100]
  speculative-t5 distill --gin_file=configs/demo_draft.gin
  speculative-t5 train_lm --gin_file=configs/gpt2_demo_target.gin   (then distill_lm, _draft.gin)
  speculative-t5 walltime_table --cell configs/paper/ende_t5_small_t0.gin [--cell ...]
      --output_dir runs/table2 [--gin.TARGET_CHECKPOINT="'gs://...'"]
  speculative-t5 alpha_table --cell ... --output_dir runs/table3
  speculative-t5 gamma_sweep --cell ... --output_dir runs/figure5
  Any command also takes [--gin_file=F ...] [--gin.decode.gamma=7] [--gin_search_paths=a,b].

Gin: `--gin_file` may repeat; `--gin.NAME=VALUE` becomes the binding `NAME = VALUE`;
`--gin_search_paths` (comma-separated) is searched for gin files and their includes, after
the package's own `gin/` directory. Flags given explicitly win over gin bindings.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib
import os
import sys
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

from speculative_t5.paper.ginconfig import gin_root, parse_gin, split_gin_flags  # noqa: F401 (public)
from speculative_t5.commands import interrupt

DTYPES = ("float32", "bfloat16", "float16")
Option = Tuple[str, Dict[str, Any]]  # (flag, argparse keyword arguments)


@dataclasses.dataclass(frozen=True)
class Command:
    """One subcommand: the function it calls ("module:name"), its options, and what to say
    when a required argument is given neither as a flag nor as a gin binding."""
    help: str
    function: str
    options: Tuple[Option, ...] = ()
    required: str = ""


DRIVER_OPTIONS: Tuple[Option, ...] = (
    ("--cell", dict(action="append", default=[], help="a cell's gin config, e.g. "
                    "configs/paper/ende_t5_small_t0.gin (repeatable)")),
    ("--output_dir", dict(required=True, help="the run directory (resumable)")),
    ("--tfds_data_dir", dict(help="where tfds finds the datasets (gs:// works); the same as "
                             "--gin.TFDS_DATA_DIR")),
    ("--quiet", dict(action="store_true", default=None)),
    ("--restart", dict(action="store_true", default=None, help="start over: the run "
                       "directory's earlier results are moved into before_restart_<time>/")))

TRAINER_OPTIONS: Tuple[Option, ...] = (
    ("--model_dir", dict(help="where checkpoints and the final model go")),
    ("--steps", dict(type=int)),
    ("--restart", dict(action="store_true", default=None, help="start over: the model_dir's "
                       "earlier checkpoints and outputs are moved into before_restart_<time>/")))

COMMANDS: Dict[str, Command] = {
    "demo": Command(
        "the shipped pair: plain vs speculative, alpha, c, v, speedup, plots",
        "speculative_t5.paper.demo:demo",
        (("--output_dir", {}), ("--num_examples", dict(type=int)), ("--gamma", dict(type=int)),
         ("--temperature", dict(type=float)),
         ("--target", dict(help="target checkpoint instead of the shipped one (with --draft, --vocab)")),
         ("--draft", {}), ("--vocab", {}),
         ("--family", dict(choices=("t5", "gpt2"), help="t5 (docstrings, the default) or gpt2 "
                           "(decoder-only: code completion)")),
         ("--drafts", dict(action="store_true", default=None, help="also the table draft kind x "
                           "verification (prompt lookup, bigram, Fallback(lookup, draft), block at T=1; "
                           "adds minutes)")))),
    "convert": Command(
        "convert a checkpoint (HF, T5X, native) to native or HF",
        "speculative_t5.commands.convert:convert",
        (("--from", dict(dest="source", help="checkpoint directory to read")),
         ("--to", dict(dest="destination", help="directory to write")),
         ("--format", dict(choices=("native", "hf"), help="output format (default native)")),
         ("--dtype", dict(choices=DTYPES, help="parameter dtype")),
         ("--overwrite", dict(action="store_true", default=None))),
        "--from and --to (or gin bindings convert.source / convert.destination)"),
    "decode": Command(
        "decode a text/TSV file into JSONL (speculative with --draft, beam search with "
        "--beam_size)",
        "speculative_t5.commands.decode:decode",
        (("--target", dict(help="target model checkpoint (HF, T5X or native)")),
         ("--draft", dict(help="draft model checkpoint, 'prompt_lookup[:MAX[:MIN]]' or "
                          "'bigram:TABLE.npz' (no model: `fit_bigram` writes the table), or "
                          "'prompt_lookup,PATH' (the lookup where it matches, else the "
                          "model); omit for plain decoding")),
         ("--input_file", dict(help="one input a line (.tsv: input<TAB>reference)")),
         ("--prompt", dict(help="one text instead of --input_file: its continuation is printed "
                           "with the target passes it took (and, greedy, whether it equals "
                           "plain greedy)")),
         ("--output", dict(help="JSONL to append to; existing indices are skipped")),
         ("--vocab", dict(help="SentencePiece model, or a directory with GPT-2's vocab.json + "
                          "merges.txt (default: the one in --target)")),
         *((f"--{name}", dict(type=typ)) for name, typ in (
             ("gamma", int), ("temperature", float), ("top_k", int), ("top_p", float),
             ("lenience", float), ("max_decode_len", int), ("max_input_len", int),
             ("batch_size", int), ("seed", int), ("draft_stop", float),
             ("max_new_tokens", int))),
         ("--adaptive_gamma", dict(action="store_true", default=None,
                                   help="each round drafts 0..gamma by eq. (5), from the running "
                                   "acceptance rate and c, v measured here")),
         ("--verification", dict(help="token (Algorithm 1, the default) or block (Sun et al. "
                                 "2025: the draft block verified jointly)")),
         ("--tree", dict(help="a token tree a round, children per depth (e.g. 3,2,1): the "
                         "draft model expands it, the target checks every node in one call "
                         "(exact; its depth replaces gamma)")),
         ("--tree_children", dict(help="drawn (from the draft without replacement, the "
                                  "default) or top_k (the draft's top k, fixed guesses)")),
         ("--beam_size", dict(type=int, help="T5X's beam search with this many beams "
                              "(st.beam_search; with a --draft checkpoint the exact speculative "
                              "beam search: the same beams); a record's output is its best beam")),
         ("--alpha", dict(type=float, help="beam search's length penalty ((5 + length) / 6) "
                          "** alpha (default 0.6)")),
         ("--beam_outputs", dict(type=int, help="beams kept in each record's \"beams\", best "
                                 "first (1..beam_size, default 1)")),
         ("--beam_paths", dict(type=int, help="speculative beam search: draft path rows per "
                               "input (>= beam_size, default 4 * beam_size)")),
         ("--prefix", dict(help="text prepended to every input, e.g. 'summarize: '")),
         ("--dtype", dict(choices=DTYPES, help="parameter dtype in memory")),
         ("--activation_dtype", dict(choices=DTYPES, help="compute dtype (T5X's "
                                     "ACTIVATION_DTYPE; default float32)"))),
        "--target, and --input_file with --output or --prompt (or decode.* gin bindings)"),
    "fit_bigram": Command(
        "fit the paper's bigram draft on text (a .tsv's references or a file's lines) and "
        "save it for --draft bigram:TABLE.npz", "speculative_t5.commands.bigram:fit_bigram",
        (("--input_file", dict(help="one text a line, or .tsv input<TAB>reference (fitted on "
                               "the references)")),
         ("--output", dict(help="the table, an .npz file")),
         ("--target", dict(help="the target checkpoint (its vocab_size and vocabulary)")),
         ("--vocab", dict(help="the vocabulary, if not in the target's directory")),
         ("--top", dict(type=int, help="successors kept per token (default 256)")),
         ("--overwrite", dict(action="store_true", default=None,
                              help="replace an --output that is not a table (never the input "
                              "file, never through a symlink)"))),
        "--input_file, --output and --target"),
    "train": Command("train a T5 on the demo corpus (gin-configured, resumable)",
                     "speculative_t5.training:train", TRAINER_OPTIONS,
                     "a --gin_file that sets the run (e.g. configs/demo_target.gin)"),
    "distill": Command("distill a draft from a teacher (gin-configured, resumable)",
                       "speculative_t5.training:distill", TRAINER_OPTIONS,
                       "a --gin_file that sets the run (e.g. configs/demo_draft.gin)"),
    "train_lm": Command("train a GPT-2 on the standard library's source (gin-configured, "
                        "resumable)", "speculative_t5.training:train_lm", TRAINER_OPTIONS,
                        "a --gin_file that sets the run (e.g. configs/gpt2_demo_target.gin)"),
    "distill_lm": Command("distill a GPT-2 draft from a train_lm target (gin-configured, "
                          "resumable)", "speculative_t5.training:distill_lm", TRAINER_OPTIONS,
                          "a --gin_file that sets the run (e.g. configs/gpt2_demo_draft.gin)"),
    "alpha_table": Command("paper Table 3: alpha per pair x task x temperature",
                           "speculative_t5.paper.drivers:alpha_table", DRIVER_OPTIONS),
    "walltime_table": Command("paper Table 2: walltime of plain vs speculative decoding",
                              "speculative_t5.paper.drivers:walltime_table", DRIVER_OPTIONS),
    "gamma_sweep": Command("paper Figure 5: speedup and operations against gamma",
                           "speculative_t5.paper.drivers:gamma_sweep", DRIVER_OPTIONS),
    "plan": Command(
        "bytes per device, fits per chip and HBM roofline times; nothing allocated",
        "speculative_t5.measure.plan:plan_command",
        (("--target", dict(help="a T5 or GPT-2 preset (t5_1_1_xxl, gpt2-xl) or a checkpoint "
                                "directory (only its config is read)")),
         ("--draft", dict(help="draft preset or checkpoint directory")),
         *((f"--{name}", dict(type=typ)) for name, typ in (
             ("num_partitions", int), ("num_devices", int), ("batch", int),
             ("input_length", int), ("max_decode_len", int), ("gamma", int), ("alpha", float))),
         ("--dtype", dict(choices=DTYPES, help="parameter dtype (bfloat16 halves parameters)")),
         ("--activation_dtype", dict(choices=DTYPES, help="activation and cache dtype")),
         ("--draft_partitioning", dict(choices=("replicated", "partitioned"))),
         ("--chip", dict(choices=("v4", "v5e", "v5p", "h100", "h200"), help="the chip to mark")),
         ("--json", dict(dest="as_json", action="store_true", default=None,
                         help="print every number as one JSON object"))),
        "--target (or the gin binding plan.target)"),
    "compile": Command(
        "compile the decode for a TPU topology with no TPU attached (libtpu): the compiler's "
        "memory per device, flops and bytes per part, c, v, predicted speedup",
        "speculative_t5.measure.tpu_compile:compile_command",
        (("--target", dict(help="a T5 or GPT-2 preset or a checkpoint directory (config only)")),
         ("--draft", dict(help="draft preset or checkpoint directory")),
         ("--topology", dict(choices=("v4-2", "v4-8", "v4-16", "v4-32", "v5e-1", "v5e-8",
                                      "v5p-8"), help="the TPU slice (default v4-8: 4 chips)")),
         *((f"--{name}", dict(type=typ)) for name, typ in (
             ("num_partitions", int), ("batch", int), ("input_length", int),
             ("max_decode_len", int), ("gamma", int), ("alpha", float))),
         ("--dtype", dict(choices=DTYPES, help="parameter dtype (activations follow it unless "
                          "--activation_dtype)")),
         ("--activation_dtype", dict(choices=DTYPES)),
         ("--draft_partitioning", dict(choices=("replicated", "partitioned"))),
         ("--parts_only", dict(action="store_true", default=None, help="compile the parts "
                               "alone, not the whole decodes (faster)")),
         ("--hlo_dir", dict(help="also write each program's optimised HLO there")),
         ("--tree", dict(help="also a target pass over a token tree of this shape (e.g. "
                         "3,2,1): its cost in target steps")),
         ("--parameter_layouts", dict(choices=("compiler", "default"), help="parameters in "
                                      "the layouts the compiler asks for (default, as a decode "
                                      "places them) or row-major")),
         ("--layout_batch", dict(type=int, help="the rows per model copy the layouts are "
                                 "chosen for (default --batch's; Partitioner.layout_batch)")),
         ("--json", dict(dest="as_json", action="store_true", default=None,
                         help="print every number as one JSON object"))),
        "--target (or the gin binding compile.target)"),
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="speculative-t5", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gin_file", action="append", default=[], help="gin file (repeatable)")
    p.add_argument("--gin_search_paths", default="", help="comma-separated gin search paths")
    p.add_argument("--debug", action="store_true", help="show a traceback for user errors too")
    # multi-host (T5X's flags): every process runs the same command; see docs/tpu.md
    p.add_argument("--multiprocess", action="store_true",
                   help="join JAX's distributed runtime, found automatically (TPU pod slices, "
                        "SLURM, Open MPI)")
    p.add_argument("--coordinator_address", help="host:port of process 0 (other clusters)")
    p.add_argument("--num_processes", type=int, help="processes in the run")
    p.add_argument("--process_id", type=int, help="this process's index, 0 = coordinator")
    p.add_argument("--initialization_timeout", type=float, default=300, metavar="SECONDS",
                   help="give up (one line, exit status 1) if not every process has joined "
                        "within this many seconds (default 300)")
    sub = p.add_subparsers(dest="command", required=True)
    for name, command in COMMANDS.items():
        sp = sub.add_parser(name, help=command.help)
        for flag, kwargs in command.options:
            sp.add_argument(flag, **kwargs)
        # gin flags are accepted after the subcommand too
        sp.add_argument("--gin_file", action="append", dest="sub_gin_file", default=[])
        sp.add_argument("--gin_search_paths", dest="sub_gin_search_paths", default="")
    return p


def _dest(flag: str, kwargs: Dict[str, Any]) -> str:
    return kwargs.get("dest", flag.lstrip("-"))


def _function(path: str) -> Callable:
    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)


def enable_compile_cache() -> Optional[str]:
    """Keep compiled programs on disk (JAX's persistent cache) so a second run of a command
    skips compilation. $SPECULATIVE_T5_COMPILE_CACHE sets the directory; 'off' disables.
    The cache is bounded (least recently used entries evicted past 4 GiB), which also makes
    JAX lock the directory around each read and write: unbounded, it writes entries in
    place, and a process started beside another (two processes of one multi-host run, two
    commands) could read a half-written entry and crash in XLA's deserializer."""
    path = os.environ.get("SPECULATIVE_T5_COMPILE_CACHE",
                          os.path.join(os.path.expanduser("~"), ".cache", "speculative_t5", "jax"))
    if path.lower() in ("", "0", "off", "none"):
        return None
    try:
        os.makedirs(path, exist_ok=True)
    except OSError:
        return None
    import jax
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    jax.config.update("jax_compilation_cache_max_size", 4 << 30)
    return path


def _end_progress_bars() -> None:
    """End the line of any progress bar still open, so an error prints on its own line."""
    tqdm = getattr(sys.modules.get("tqdm"), "tqdm", None)
    for bar in list(getattr(tqdm, "_instances", ())):
        try:
            bar.close()
        except Exception:  # a bar half torn down: the message still prints
            pass


def skip_absent_tpu() -> None:
    """With libtpu installed (the `tpu` extra, for `compile`) on a machine with no TPU and no
    GPU plugin, JAX would try the TPU first and print libtpu's warnings: use the CPU, unless
    JAX_PLATFORMS says otherwise. A TPU VM shows its chips as /dev/accel* or /dev/vfio/*."""
    import glob
    import importlib.util
    if os.environ.get("JAX_PLATFORMS") or importlib.util.find_spec("libtpu") is None:
        return
    if glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*") or any(
            importlib.util.find_spec(p) for p in GPU_PLUGINS):
        return
    import jax
    jax.config.update("jax_platforms", "cpu")


GPU_PLUGINS = ("jax_cuda12_plugin", "jax_cuda13_plugin", "jax_rocm6_plugin", "jax_rocm7_plugin")


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    skip_absent_tpu()
    bindings, rest = split_gin_flags(argv)
    args = _parser().parse_args(rest)
    files = args.gin_file + args.sub_gin_file
    paths = [s for s in (args.gin_search_paths + "," + args.sub_gin_search_paths).split(",") if s]
    from speculative_t5.partitioning import initialize_distributed
    try:
        distributed = initialize_distributed(
            args.coordinator_address, args.num_processes, args.process_id,
            auto=args.multiprocess, initialization_timeout=args.initialization_timeout)
    except (ValueError, RuntimeError) as e:
        raise SystemExit(f"error: {e}") from None
    enable_compile_cache()
    command = COMMANDS[args.command]
    # importing every command's module registers all gin configurables before parsing
    functions = {name: _function(c.function) for name, c in COMMANDS.items()}
    parse_gin(files, bindings, paths)
    fn = functions[args.command]
    explicit = {_dest(f, kw): getattr(args, _dest(f, kw)) for f, kw in command.options}
    explicit = {k: v for k, v in explicit.items() if v is not None}
    if command.options is DRIVER_OPTIONS:  # each cell parses its own config with these flags
        fn = functools.partial(fn, gin_files=files, bindings=bindings, search_paths=paths)
    from speculative_t5.checkpoints import CheckpointError
    try:
        with interrupt.interruptible():
            fn(**explicit)
    except KeyboardInterrupt:
        # a compiled loop may still run on XLA's threads, and interpreter shutdown would
        # wait for it: leave at once (records are already whole and fsynced)
        code = interrupt.finish()
        sys.stdout.flush()
        os._exit(code)
    except (CheckpointError, ValueError, OSError) as e:  # the user's input, named: one line
        if args.debug:
            raise
        message = str(e).split("\n  In call to configurable")[0]  # gin's addition: a 2nd line
        raise SystemExit(f"error: {message}") from None
    except RuntimeError as e:  # gin.REQUIRED unfilled: neither flag nor binding given
        from speculative_t5.partitioning import lost_peer
        lost = lost_peer(e) if distributed else None
        if lost:  # leave at once: exiting normally would wait on the lost process
            if args.debug:
                import traceback
                traceback.print_exc()
            _end_progress_bars()
            print(f"error: {lost}", file=sys.stderr, flush=True)
            sys.stdout.flush()
            os._exit(1)
        if "Required bindings" not in str(e):
            raise
        raise SystemExit(f"error: {args.command} needs {command.required}") from None
    return 0


if __name__ == "__main__":
    sys.exit(main())
