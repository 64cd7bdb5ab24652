"""`speculative-t5` command line, launched the T5X way.

  speculative-t5 demo [--output_dir D] [--num_examples N] [--gamma G] [--temperature T]
  speculative-t5 convert --from PATH --to PATH [--format native|hf] [--dtype bfloat16]
  speculative-t5 decode --target PATH [--draft PATH] --input_file F --output F.jsonl
      [--vocab spiece.model] [--gamma 4] [--temperature 0] [--top_k 0] [--top_p 1] ...
  speculative-t5 train --gin_file=configs/demo_target.gin [--gin.train.steps=100]
  speculative-t5 distill --gin_file=configs/demo_draft.gin
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
import functools
import os
import sys
from typing import Optional, Sequence

import gin

from speculative_t5.ginconfig import gin_root, parse_gin, split_gin_flags  # noqa: F401 (public)


@gin.configurable
def convert(source: str = gin.REQUIRED, destination: str = gin.REQUIRED, format: str = "native",
            dtype: Optional[str] = None, overwrite: bool = False) -> None:
    """Read any supported checkpoint and write it as native (orbax) or Hugging Face."""
    from speculative_t5.checkpoints import export_hf, load_checkpoint, save_checkpoint
    if format not in ("native", "hf"):
        raise SystemExit(f"error: --format must be 'native' or 'hf', got {format!r}")
    model = load_checkpoint(source, dtype=dtype)
    if format == "hf":
        if os.path.exists(destination) and os.listdir(destination) and not overwrite:
            raise SystemExit(f"error: {destination} exists and is not empty (pass --overwrite)")
        export_hf(model, destination)
    else:
        save_checkpoint(model, destination, overwrite=overwrite)
    c = model.config
    print(f"converted {source} -> {destination} ({format}): {model.num_params():,} parameters, "
          f"{c.num_encoder_layers}+{c.num_decoder_layers} layers, emb {c.emb_dim}, "
          f"vocab {c.vocab_size}, {c.param_dtype}")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="speculative-t5", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gin_file", action="append", default=[], help="gin file (repeatable)")
    p.add_argument("--gin_search_paths", default="", help="comma-separated gin search paths")
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("convert", help="convert a checkpoint (HF, T5X, native) to native or HF")
    c.add_argument("--from", dest="source", help="checkpoint directory to read")
    c.add_argument("--to", dest="destination", help="directory to write")
    c.add_argument("--format", choices=("native", "hf"), help="output format (default native)")
    c.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), help="parameter dtype")
    c.add_argument("--overwrite", action="store_true", default=None)
    d = sub.add_parser("decode", help="decode a text/TSV file into JSONL (speculative with --draft)")
    d.add_argument("--target", help="target model checkpoint (HF, T5X or native)")
    d.add_argument("--draft", help="draft model checkpoint; omit for plain decoding")
    d.add_argument("--input_file", help="one input a line (.tsv: input<TAB>reference)")
    d.add_argument("--output", help="JSONL to append to; existing indices are skipped")
    d.add_argument("--vocab", help="SentencePiece model (default: spiece.model in --target)")
    for name, typ in (("gamma", int), ("temperature", float), ("top_k", int), ("top_p", float),
                      ("lenience", float), ("max_decode_len", int), ("max_input_len", int),
                      ("batch_size", int), ("seed", int)):
        d.add_argument("--" + name, type=typ)
    d.add_argument("--prefix", help="text prepended to every input, e.g. 'summarize: '")
    d.add_argument("--dtype", choices=("float32", "bfloat16", "float16"))
    m = sub.add_parser("demo", help="the shipped pair: plain vs speculative, alpha, c, v, speedup, plots")
    m.add_argument("--output_dir")
    m.add_argument("--num_examples", type=int)
    m.add_argument("--gamma", type=int)
    m.add_argument("--temperature", type=float)
    m.add_argument("--target", help="target checkpoint instead of the shipped one (with --draft, --vocab)")
    m.add_argument("--draft")
    m.add_argument("--vocab")
    trainers = []
    for name, text in (("train", "train a T5 on the demo corpus (gin-configured, resumable)"),
                       ("distill", "distill a draft from a teacher (gin-configured, resumable)")):
        t = sub.add_parser(name, help=text)
        t.add_argument("--model_dir", help="where checkpoints and the final model go")
        t.add_argument("--steps", type=int)
        trainers.append(t)
    drivers = []
    for name, text in (("alpha_table", "paper Table 3: alpha per pair x task x temperature"),
                       ("walltime_table", "paper Table 2: walltime of plain vs speculative decoding"),
                       ("gamma_sweep", "paper Figure 5: speedup and operations against gamma")):
        t = sub.add_parser(name, help=text)
        t.add_argument("--cell", action="append", default=[],
                       help="a cell's gin config, e.g. configs/paper/ende_t5_small_t0.gin (repeatable)")
        t.add_argument("--output_dir", required=True, help="the run directory (resumable)")
        t.add_argument("--tfds_data_dir", help="where tfds finds the datasets (gs:// works); "
                       "the same as --gin.TFDS_DATA_DIR")
        t.add_argument("--quiet", action="store_true")
        drivers.append(t)
    for sp in (c, d, m, *trainers, *drivers):  # gin flags are accepted after the subcommand too
        sp.add_argument("--gin_file", action="append", dest="sub_gin_file", default=[])
        sp.add_argument("--gin_search_paths", dest="sub_gin_search_paths", default="")
    return p


def enable_compile_cache() -> Optional[str]:
    """Keep compiled programs on disk (JAX's persistent cache) so a second run of a command
    skips compilation. $SPECULATIVE_T5_COMPILE_CACHE sets the directory; 'off' disables."""
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
    return path


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    bindings, rest = split_gin_flags(argv)
    args = _parser().parse_args(rest)
    files = args.gin_file + args.sub_gin_file
    paths = [s for s in (args.gin_search_paths + "," + args.sub_gin_search_paths).split(",") if s]
    enable_compile_cache()
    from speculative_t5 import demo, paper, run_decode, training  # registers gin configurables
    parse_gin(files, bindings, paths)
    from speculative_t5.checkpoints import CheckpointError
    if args.command in paper.DRIVERS:  # each cell parses its own config with these flags
        if args.tfds_data_dir:
            bindings.append(f"TFDS_DATA_DIR = {args.tfds_data_dir!r}")
        fn = functools.partial(paper.run, args.command, args.cell, args.output_dir, files,
                               bindings, paths, args.quiet)
        names, required = (), ""
    elif args.command == "convert":
        fn, names = convert, ("source", "destination", "format", "dtype", "overwrite")
        required = "--from and --to (or gin bindings convert.source / convert.destination)"
    elif args.command == "demo":
        fn = demo.demo
        names = ("output_dir", "num_examples", "gamma", "temperature", "target", "draft", "vocab")
        required = ""
    elif args.command in ("train", "distill"):
        fn, names = getattr(training, args.command), ("model_dir", "steps")
        required = "a --gin_file that sets the run (e.g. configs/demo_target.gin)"
    else:
        fn = run_decode.decode
        names = ("target", "draft", "input_file", "output", "vocab", "gamma", "temperature",
                 "top_k", "top_p", "lenience", "max_decode_len", "max_input_len", "batch_size",
                 "seed", "prefix", "dtype")
        required = "--target, --input_file and --output (or decode.* gin bindings)"
    explicit = {k: getattr(args, k) for k in names if getattr(args, k) is not None}
    try:
        fn(**explicit)
    except (CheckpointError, ValueError, FileNotFoundError) as e:
        raise SystemExit(f"error: {e}") from None
    except RuntimeError as e:  # gin.REQUIRED unfilled: neither flag nor binding given
        if "Required bindings" not in str(e):
            raise
        raise SystemExit(f"error: {args.command} needs {required}") from None
    return 0


if __name__ == "__main__":
    sys.exit(main())
