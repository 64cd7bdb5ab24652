"""The demo's summary-quality measure: words, real-word fraction, ROUGE beside it."""
import pytest

from speculative_t5.measure import quality


def test_words_are_lowercased_letter_runs():
    assert quality.words("get_user() Returns 2 VALUES.") == ["get", "user", "returns", "values"]


def test_real_word_fraction_pools_the_texts():
    known = frozenset({"return", "the", "sum"})
    assert quality.real_word_fraction(["Return the sum.", "the viewerimect"], known) == 0.8
    assert quality.real_word_fraction(["", "..."], known) != quality.real_word_fraction(
        ["", "..."], known)                                      # nan: no words at all


def test_stdlib_docstring_words():
    vocab = quality.docstring_words()
    assert {"return", "the", "iterator", "socket", "encoding"} <= vocab
    assert not {"viewerimect", "docures", "queueueue"} & vocab
    assert len(vocab) > 5000


def test_summary_quality_scores_against_references():
    refs = ["Return the sum of a and b.", "Close the socket."]
    q = quality.summary_quality(refs, refs)
    assert q["rouge1"] == pytest.approx(100.0) and q["real_words"] == 1.0
    worse = quality.summary_quality(refs, ["Return the product.", "Open a file."])
    assert 0 < worse["rouge1"] < 100 and worse["rouge2"] < worse["rouge1"]
    with pytest.raises(ValueError, match="2 references for 1 outputs"):
        quality.summary_quality(refs, refs[:1])


def test_name_baseline_is_the_function_name_as_words():
    assert quality.name_baseline("summarize: def _type_repr(obj):\n    pass") == \
        "Return the type repr."
    assert quality.name_baseline("class A:\n    def getUser2_id(self): ...") == \
        "Return the get user id."
    assert quality.name_baseline("x = 1") == ""
    q = quality.summary_quality(["Return the repr() of a type."],
                                [quality.name_baseline("def _type_repr(obj): pass")])
    assert 0 < q["rouge1"] < 100
