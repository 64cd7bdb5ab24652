"""`speculative-t5 fit_bigram`: the paper's bigram draft (section 4: alpha ~0.2 on
translation, no model at all) fitted on text and saved, for `--draft bigram:TABLE.npz` and a
cell's `DRAFT_CHECKPOINT = 'bigram:TABLE.npz'`.

Fit it on what the target writes: a .tsv's references (input<TAB>reference: the output
side), or a text file's lines (e.g. the target's own outputs, one a line)."""
from __future__ import annotations

import os
import secrets
from typing import Any, Dict, Optional

import gin

from speculative_t5.data import find_vocabulary, read_inputs
from speculative_t5.decoding.drafts import Bigram


@gin.configurable("fit_bigram")
def fit_bigram(input_file: str = gin.REQUIRED, output: str = gin.REQUIRED,
               target: str = gin.REQUIRED, vocab: Optional[str] = None, top: int = 256,
               smoothing: float = 0.01, overwrite: bool = False) -> Dict[str, Any]:
    """Tokenize input_file with the target's vocabulary (or `vocab`), fit `Bigram.fit`
    (top successors per token, add-`smoothing` counts) at the target's vocab_size (read
    from its config alone), write the table to `output` atomically (`check_output` first)."""
    from speculative_t5.measure.plan import read_config
    check_output(output, input_file, overwrite)
    vocab_size = read_config(target).vocab_size
    vocabulary = find_vocabulary(vocab, target)
    vocabulary.check_fits(vocab_size)
    rows = read_inputs(input_file)
    texts = [ref for _, ref in rows] if input_file.endswith(".tsv") else [t for t, _ in rows]
    if any(t is None for t in texts):
        raise ValueError(f"{input_file}: every .tsv line needs a reference after its tab "
                         "(the bigram is fitted on the output side)")
    sequences = [vocabulary.encode(t) for t in texts]
    table = Bigram.fit(sequences, vocab_size, top=top, smoothing=smoothing)
    write_table(table, output)
    tokens = sum(len(s) for s in sequences)
    print(f"fitted {table!r} on {len(sequences)} sequences ({tokens} tokens) of {input_file}; "
          f"wrote {output} (use: --draft bigram:{output})")
    return {"sequences": len(sequences), "tokens": tokens, "output": output}


def check_output(output: str, input_file: Optional[str], overwrite: bool = False) -> None:
    """Refuse (one-line ValueError, nothing written) an output that is not an .npz name, is
    a symlink or not a regular file, is the input file (even with overwrite), or holds
    anything but a Bigram table (unless overwrite); or whose directory does not exist."""
    if not isinstance(output, str) or not output.endswith(".npz"):
        raise ValueError(f"output must name an .npz file, got {output!r}")
    if os.path.islink(output):
        raise ValueError(f"{output} is a symbolic link; fit_bigram never writes through one "
                         "(not even with --overwrite): name the file itself or another path")
    if os.path.lexists(output):
        if not os.path.isfile(output):
            raise ValueError(f"{output} exists and is not a regular file; it was left "
                             "untouched: choose another --output")
        if input_file and os.path.exists(input_file) and os.path.samefile(input_file, output):
            raise ValueError(f"{output} is the input file {input_file}; it was left untouched: "
                             "choose another --output")
        if not overwrite:
            try:
                Bigram.load(output)
            except ValueError:
                raise ValueError(f"{output} exists and is not a Bigram table; it was left "
                                 "untouched: choose another --output, or pass --overwrite to "
                                 "replace it") from None
    directory = os.path.dirname(output) or "."
    if not os.path.isdir(directory):
        raise ValueError(f"{output}: its directory {directory} does not exist")


def write_table(table: Bigram, output: str) -> None:
    """`table.save` to a new temporary file beside `output` (fsynced), then renamed over
    it: `output` is the old file or the new table, never a part; a symlink at `output` is
    replaced by a rename, never written through (`check_output` refuses one anyway)."""
    directory = os.path.dirname(os.path.abspath(output))
    tmp = os.path.join(directory, f".{os.path.basename(output)}.{os.getpid()}."
                                  f"{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            table.save(f)                                   # flushed and fsynced
        if os.path.islink(output):                          # appeared since check_output
            raise ValueError(f"{output} is a symbolic link; fit_bigram never writes through "
                             "one: name the file itself or another path")
        os.replace(tmp, output)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    try:
        dfd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dfd)                                       # the rename itself survives a crash
    except OSError:
        pass
    finally:
        os.close(dfd)
