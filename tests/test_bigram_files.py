"""Bigram table files (issue #39, items 1 and 8): `fit_bigram --output` never destroys what
the user wrote (another file, its own input, a symlink's target) and writes atomically;
`--draft bigram:TABLE.npz` refuses hostile, truncated and malformed tables in one line."""
import io
import os
import shutil
import zipfile

import jax
import numpy as np
import pytest

import speculative_t5 as st
from helpers import tiny_config, train_sentencepiece
from speculative_t5 import commands as cli
from speculative_t5.checkpoints import load_draft
from speculative_t5.decoding.drafts import Bigram
from speculative_t5.model.api import param_shapes

V = tiny_config().vocab_size  # 53


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A tiny target (zero weights: no init compiled) with a SentencePiece vocabulary, a
    text to fit on and a valid table fitted on it."""
    d = tmp_path_factory.mktemp("bigram_files")
    spm = train_sentencepiece(str(d))
    config = tiny_config()
    params = jax.tree_util.tree_map(lambda x: np.zeros(x.shape, x.dtype), param_shapes(config))
    target = str(d / "target")
    st.export_hf(st.Model(config, params), target)
    shutil.copy(spm, os.path.join(target, "spiece.model"))
    text = d / "refs.txt"
    text.write_text("the quick brown fox\na lazy dog\nseven small birds sing\n")
    table = str(d / "table.npz")
    assert cli.main(["fit_bigram", "--input_file", str(text), "--target", target,
                     "--output", table, "--top", "4"]) == 0
    return dict(dir=d, target=target, text=str(text), table=table)


def _fit(setup, output, *extra, input_file=None, target=None):
    return cli.main(["fit_bigram", "--input_file", input_file or setup["text"],
                     "--target", target or setup["target"], "--output", str(output),
                     "--top", "4", *extra])


def _refused(match, fn, *args, **kwargs):
    """fn(...) stops with one line (a SystemExit from the CLI or a ValueError) matching
    `match`; -> the message."""
    with pytest.raises((SystemExit, ValueError), match=match) as e:
        fn(*args, **kwargs)
    message = str(e.value)
    assert "\n" not in message, message
    return message


def _no_temp_files(directory):
    assert [f for f in os.listdir(directory) if f.startswith(".")] == []


def _arrays(path):
    with np.load(path) as f:
        return {k: f[k] for k in f.files}


def _save(path, **arrays):
    with open(path, "wb") as f:
        np.savez(f, **arrays)
    return str(path)


# item 1: fit_bigram --output


def test_fit_bigram_refuses_an_existing_file_that_is_not_a_table(setup, tmp_path):
    important = tmp_path / "important.npz"
    important.write_text("my notes, not a table\n")
    # refused before the target is even read (a missing target would be the error otherwise)
    msg = _refused("error: .*important.npz exists and is not a Bigram table.*--overwrite",
                   _fit, setup, important, target=str(tmp_path / "no_target"))
    assert str(important) in msg
    assert important.read_text() == "my notes, not a table\n"
    (tmp_path / "dir.npz").mkdir()
    _refused("dir.npz exists and is not a regular file", _fit, setup, tmp_path / "dir.npz",
             "--overwrite")
    _no_temp_files(tmp_path)
    # asked for: --overwrite replaces it with a table
    assert _fit(setup, important, "--overwrite") == 0
    assert Bigram.load(str(important)).vocab_size == V
    _no_temp_files(tmp_path)


def test_fit_bigram_refuses_its_own_input_file_even_with_overwrite(setup, tmp_path):
    same = tmp_path / "same.npz"
    same.write_text("the quick brown fox\na lazy dog\n")
    before = same.read_bytes()
    for extra in ((), ("--overwrite",)):
        _refused(r"same.npz is the input file", _fit, setup, same, *extra, input_file=str(same))
    os.link(same, tmp_path / "hard.npz")               # the same file under another name
    _refused(r"hard.npz is the input file", _fit, setup, tmp_path / "hard.npz", "--overwrite",
             input_file=str(same))
    assert same.read_bytes() == before
    _no_temp_files(tmp_path)


def test_fit_bigram_never_writes_through_a_symlink(setup, tmp_path):
    important = tmp_path / "important.txt"
    important.write_text("keep me\n")
    (tmp_path / "link.npz").symlink_to(important)
    (tmp_path / "dangling.npz").symlink_to(tmp_path / "missing.txt")
    (tmp_path / "to_table.npz").symlink_to(setup["table"])      # even to a table
    table_before = open(setup["table"], "rb").read()
    for name in ("link.npz", "dangling.npz", "to_table.npz"):
        for extra in ((), ("--overwrite",)):
            _refused(f"{name} is a symbolic link", _fit, setup, tmp_path / name, *extra)
        assert (tmp_path / name).is_symlink()
    assert important.read_text() == "keep me\n" and not (tmp_path / "missing.txt").exists()
    assert open(setup["table"], "rb").read() == table_before
    _no_temp_files(tmp_path)


def test_fit_bigram_replaces_its_own_table_atomically(setup, tmp_path, monkeypatch):
    out = tmp_path / "t.npz"
    assert _fit(setup, out) == 0
    first = Bigram.load(str(out))
    assert first.vocab_size == V and first.successors.shape == (V, 4)
    # a table it wrote is replaced without --overwrite, and with it
    assert cli.main(["fit_bigram", "--input_file", setup["text"], "--target", setup["target"],
                     "--output", str(out), "--top", "2"]) == 0
    assert Bigram.load(str(out)).successors.shape == (V, 2)
    assert _fit(setup, out, "--overwrite") == 0
    again = Bigram.load(str(out))
    for a, b in zip((first.successors, first.probs, first.rest),
                    (again.successors, again.probs, again.rest)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # a write that fails midway leaves the old table whole and no temporary file
    before = out.read_bytes()

    def broken_save(self, f):
        f.write(b"PK\x03\x04 half a table")
        raise OSError("disk full")
    monkeypatch.setattr(Bigram, "save", broken_save)
    _refused("error: disk full", _fit, setup, out, "--overwrite")
    assert out.read_bytes() == before
    _no_temp_files(tmp_path)


# item 8: loading `--draft bigram:TABLE.npz`


def _declared(table, path, name, shape, descr="<f4", data=b"\0" * 16):
    """A copy of `table` whose member `name` declares `shape` over a few bytes."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, dict(descr=descr, fortran_order=False,
                                                      shape=shape))
    with zipfile.ZipFile(path, "w") as out:
        for key, value in _arrays(table).items():
            if key == name:
                out.writestr(f"{key}.npy", header.getvalue() + data)  # magic + header
            else:
                buf = io.BytesIO()
                np.lib.format.write_array(buf, value)
                out.writestr(f"{key}.npy", buf.getvalue())
    return str(path)


def test_hostile_header_is_refused_before_allocating(setup, tmp_path):
    hostile = _declared(setup["table"], tmp_path / "hostile.npz", "probs", (10 ** 7, 10 ** 6))
    before = open(hostile, "rb").read()
    msg = _refused(r"hostile.npz: not a Bigram table.*probs.npy declares shape "
                   r"\(10000000, 1000000\)", load_draft, f"bigram:{hostile}")
    assert hostile in msg
    # the CLI: one `error:` line, before any decoding
    _refused(r"^error: .*hostile.npz: not a Bigram table", cli.main,
             ["decode", "--target", setup["target"], "--draft", f"bigram:{hostile}",
              "--prompt", "the data", "--max_decode_len", "4"])
    # a header within the file's size but of another vocabulary than the target's
    small = _save(tmp_path / "small.npz", **dict(_arrays(setup["table"]), rest=np.zeros(3)))
    _refused(r"small.npz: Bigram arrays have shapes", load_draft, f"bigram:{small}")
    _refused(rf"table.npz: a Bigram table of vocab_size {V}, the target's is 32128",
             load_draft, f"bigram:{setup['table']}", vocab_size=32128)
    assert open(hostile, "rb").read() == before


def test_truncated_or_corrupt_table(setup, tmp_path):
    data = open(setup["table"], "rb").read()
    for n in (0, 10, len(data) // 2, len(data) - 1):
        path = tmp_path / f"cut{n}.npz"
        path.write_bytes(data[:n])
        msg = _refused(rf"cut{n}.npz: not a Bigram table.*(not a whole zip archive|declares)",
                       load_draft, f"bigram:{path}")
        assert str(path) in msg and path.read_bytes() == data[:n]
    # a flipped byte inside a member's data: its CRC no longer matches
    with zipfile.ZipFile(setup["table"]) as z:
        info = z.getinfo("probs.npy")
    flipped = bytearray(data)
    flipped[info.header_offset + 30 + len(info.filename) + len(info.extra) + 200] ^= 0xFF
    path = tmp_path / "flipped.npz"
    path.write_bytes(bytes(flipped))
    _refused("flipped.npz: not a Bigram table.*(not a whole zip archive|distributions)",
             load_draft, f"bigram:{path}")


def test_zero_vocabulary_table(setup, tmp_path):
    empty = _save(tmp_path / "empty.npz", kind=np.array("speculative_t5.Bigram"),
                  successors=np.zeros((0, 4), np.int32), probs=np.zeros((0, 4), np.float32),
                  rest=np.zeros((0,), np.float32))
    _refused("empty.npz: a Bigram table of vocab_size 0", load_draft, f"bigram:{empty}")
    no_top = _save(tmp_path / "no_top.npz", **dict(
        _arrays(setup["table"]), successors=np.zeros((V, 0), np.int32),
        probs=np.zeros((V, 0), np.float32)))
    _refused("no_top.npz: a Bigram table of vocab_size 53 and top 0", load_draft,
             f"bigram:{no_top}")


def test_nan_probabilities(setup, tmp_path):
    arrays = _arrays(setup["table"])
    probs = arrays["probs"].copy()
    probs[3, 1] = np.nan
    nan = _save(tmp_path / "nan.npz", **dict(arrays, probs=probs))
    _refused(r"nan.npz: non-finite probabilities \(NaN or inf\) in 1 rows \(first: row 3\)",
             load_draft, f"bigram:{nan}")
    rest = arrays["rest"].copy()
    rest[5] = np.inf
    inf = _save(tmp_path / "inf.npz", **dict(arrays, rest=rest))
    _refused("inf.npz: non-finite probabilities", load_draft, f"bigram:{inf}")
    negative = arrays["probs"].copy()                   # row 0's sum kept, one entry < 0
    shift = negative[0, 1] + 0.01
    negative[0, 1] -= shift
    negative[0, 0] += shift
    neg = _save(tmp_path / "neg.npz", **dict(arrays, probs=negative))
    _refused("neg.npz: Bigram rows are not distributions", load_draft, f"bigram:{neg}")


def test_duplicate_or_out_of_range_successors(setup, tmp_path):
    arrays = _arrays(setup["table"])
    succ = arrays["successors"].copy()
    succ[7, 2] = succ[7, 0]
    dup = _save(tmp_path / "dup.npz", **dict(arrays, successors=succ))
    _refused(r"dup.npz: repeated successor ids in 1 rows \(first: row 7\)", load_draft,
             f"bigram:{dup}")
    succ = arrays["successors"].copy()
    succ[1, 0] = V
    out = _save(tmp_path / "out.npz", **dict(arrays, successors=succ))
    _refused(rf"out.npz: successor ids in \[0, {V}\], outside \[0, {V}\)", load_draft,
             f"bigram:{out}")
    obj = _save(tmp_path / "obj.npz", **dict(arrays, successors=succ.astype(object)))
    _refused("obj.npz: not a Bigram table.*Python objects", load_draft, f"bigram:{obj}")


def test_valid_table_round_trips(setup, tmp_path):
    b = Bigram.load(setup["table"])
    path = str(tmp_path / "again.npz")
    b.save(path)                                        # Bigram.save's format, unchanged
    assert sorted(_arrays(path)) == ["kind", "probs", "rest", "successors"]
    c = load_draft(f"bigram:{path}", vocab_size=V)
    for x, y in zip((b.successors, b.probs, b.rest), (c.successors, c.probs, c.rest)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert open(path, "rb").read() == open(setup["table"], "rb").read()
    # a compressed .npz of the same arrays loads too
    packed = str(tmp_path / "packed.npz")
    np.savez_compressed(packed, **_arrays(path))
    assert Bigram.load(packed).vocab_size == V
