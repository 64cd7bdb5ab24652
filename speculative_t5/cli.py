"""`speculative-t5` command line, launched the T5X way.

  speculative-t5 convert --from PATH --to PATH [--format native|hf] [--dtype bfloat16]
      [--gin_file=F ...] [--gin.convert.dtype="'bfloat16'"] [--gin_search_paths=a,b]

Gin: `--gin_file` may repeat; `--gin.NAME=VALUE` becomes the binding `NAME = VALUE`;
`--gin_search_paths` (comma-separated) is searched for gin files and their includes, after
the package's own `gin/` directory. Flags given explicitly win over gin bindings.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional, Sequence, Tuple

import gin


def gin_root() -> str:
    """The directory holding the reusable gin blocks (`models/t5_1_1/base.gin`, ...)."""
    here = os.path.dirname(os.path.abspath(__file__))
    for candidate in (os.path.join(here, "gin"), os.path.join(os.path.dirname(here), "gin")):
        if os.path.isdir(os.path.join(candidate, "models")):
            return candidate
    raise FileNotFoundError("speculative_t5's gin/ directory is missing from this installation")


def split_gin_flags(argv: Sequence[str]) -> Tuple[List[str], List[str]]:
    """Separate `--gin.NAME=VALUE` flags (returned as gin bindings) from the rest."""
    bindings, rest = [], []
    for arg in argv:
        if arg.startswith("--gin."):
            name, eq, value = arg[len("--gin."):].partition("=")
            if not eq or not name:
                raise SystemExit(f"error: {arg!r} must look like --gin.NAME=VALUE")
            bindings.append(f"{name} = {value}")
        else:
            rest.append(arg)
    return bindings, rest


def parse_gin(files: Sequence[str], bindings: Sequence[str], search_paths: Sequence[str]) -> None:
    """Apply gin files and bindings; a bad file or binding exits with a message naming it."""
    gin.clear_config()
    for path in [gin_root(), os.getcwd(), *search_paths]:
        gin.add_config_file_search_path(path)
    try:
        gin.parse_config_files_and_bindings(list(files), list(bindings), finalize_config=False)
    except (ValueError, KeyError, IOError, SyntaxError, TypeError) as e:
        raise SystemExit(f"error: bad gin configuration: {type(e).__name__}: {e}") from None


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
    for sp in (c,):  # gin flags are accepted after the subcommand too
        sp.add_argument("--gin_file", action="append", dest="sub_gin_file", default=[])
        sp.add_argument("--gin_search_paths", dest="sub_gin_search_paths", default="")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    bindings, rest = split_gin_flags(argv)
    args = _parser().parse_args(rest)
    files = args.gin_file + args.sub_gin_file
    paths = [s for s in (args.gin_search_paths + "," + args.sub_gin_search_paths).split(",") if s]
    parse_gin(files, bindings, paths)
    from speculative_t5.checkpoints import CheckpointError
    if args.command == "convert":
        explicit = {k: v for k, v in dict(source=args.source, destination=args.destination,
                                          format=args.format, dtype=args.dtype,
                                          overwrite=args.overwrite).items() if v is not None}
        try:
            convert(**explicit)
        except CheckpointError as e:
            raise SystemExit(f"error: {e}") from None
        except RuntimeError as e:  # gin.REQUIRED unfilled: neither flag nor binding given
            if "Required bindings" not in str(e):
                raise
            raise SystemExit("error: convert needs --from and --to "
                             "(or gin bindings convert.source / convert.destination)") from None
    return 0


if __name__ == "__main__":
    sys.exit(main())
