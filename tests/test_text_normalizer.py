import json

import pytest

from tools import text_normalizer
from tools.text_normalizer import normalize, wer


@pytest.mark.parametrize(
    "spoken, written",
    [
        ("Mr. Smith met Mrs. Jones.", "mister smith met missus jones"),
        ("He won't go; I'm sure.", "he will not go i am sure"),
        ("[noise] so (laughs) um yes", "so yes"),
        ("twenty-one", "21"),
        ("one hundred and five", "105"),
        ("nineteen ninety-five", "1995"),
        ("two point five percent", "2.5%"),
        ("five dollars", "$5"),
    ],
)
def test_whisper_normalisation_makes_surface_forms_equal(spoken, written):
    assert normalize(spoken) == normalize(written)


def test_spelling_table_comes_from_the_cache_folder(tmp_path, monkeypatch):
    (tmp_path / text_normalizer.SPELLING_FILE).write_text(json.dumps({"colour": "color"}), encoding="utf-8")
    monkeypatch.setenv("MEDUSA_ASR_CACHE", str(tmp_path))
    for cached in (text_normalizer.spelling_table, text_normalizer.english_normalizer):
        cached.cache_clear()
    try:
        assert normalize("The Colour!") == "the color"
    finally:
        for cached in (text_normalizer.spelling_table, text_normalizer.english_normalizer):
            cached.cache_clear()


def test_wer_is_corpus_level_after_normalisation():
    assert wer(["Mr. Smith has three cats."], ["mister smith has 3 cats"]) == 0.0
    assert wer(["a b c d"], ["a x c"]) == pytest.approx(0.5)  # 1 substitution + 1 deletion
    assert wer(["a b", "c d e f"], ["a b", "c"]) == pytest.approx(3 / 6)


def test_wer_handles_empty_references_and_checks_lengths():
    assert wer(["", "a b"], ["x", "a b"]) == pytest.approx(1 / 2)  # x: one insertion over 2 reference words
    with pytest.raises(ValueError):
        wer(["a"], [])
    with pytest.raises(ValueError):
        wer([""], ["a"])
