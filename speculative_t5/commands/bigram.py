"""`speculative-t5 fit_bigram`: the paper's bigram draft (section 4: alpha ~0.2 on
translation, no model at all) fitted on text and saved, for `--draft bigram:TABLE.npz` and a
cell's `DRAFT_CHECKPOINT = 'bigram:TABLE.npz'`.

Fit it on what the target writes: a .tsv's references (input<TAB>reference: the output
side), or a text file's lines (e.g. the target's own outputs, one a line)."""
from __future__ import annotations

from typing import Any, Dict, Optional

import gin

from speculative_t5.data import find_vocabulary, read_inputs
from speculative_t5.decoding.drafts import Bigram


@gin.configurable("fit_bigram")
def fit_bigram(input_file: str = gin.REQUIRED, output: str = gin.REQUIRED,
               target: str = gin.REQUIRED, vocab: Optional[str] = None, top: int = 256,
               smoothing: float = 0.01) -> Dict[str, Any]:
    """Tokenize input_file with the target's vocabulary (or `vocab`), fit `Bigram.fit`
    (top successors per token, add-`smoothing` counts) at the target's vocab_size (read
    from its config alone), write the table to `output`."""
    from speculative_t5.measure.plan import read_config
    if not output.endswith(".npz"):
        raise ValueError(f"output must name an .npz file, got {output!r}")
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
    table.save(output)
    tokens = sum(len(s) for s in sequences)
    print(f"fitted {table!r} on {len(sequences)} sequences ({tokens} tokens) of {input_file}; "
          f"wrote {output} (use: --draft bigram:{output})")
    return {"sequences": len(sequences), "tokens": tokens, "output": output}
