import pytest

from pipeline.text_normalizer import normalize, wer, word_errors


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Hello, World!", "hello world"),
        ("  many   spaces\tand\nnewlines ", "many spaces and newlines"),
        ("Mr. Smith met Mrs. Jones and Dr. Who.", "mister smith met missus jones and doctor who"),
        ("St. Paul's", "saint paul is"),
        ("He won't go; they can't, I'm sure.", "he will not go they can not i am sure"),
        ("[noise] so (laughs) <unk> um yes", "so yes"),
        ("Café naïve", "cafe naive"),
        ("U.S.A. at 10am", "usa at 10 am"),
        ("self-substantial fuel", "self substantial fuel"),
        ("Feed'st thy light's flame", "feedst thy light is flame"),
    ],
)
def test_text_cleanup(text, expected):
    assert normalize(text) == expected


@pytest.mark.parametrize(
    "spoken, written",
    [
        ("three apples", "3 apples"),
        ("twenty-one", "21"),
        ("twenty one", "21"),
        ("one hundred and five", "105"),
        ("a hundred people", "100 people"),
        ("three thousand two hundred", "3,200"),
        ("two million", "2000000"),
        ("nineteen ninety-five", "1995"),
        ("nineteen hundred", "1900"),
        ("nineteen oh five", "1905"),
        ("two thousand and twenty", "2020"),
        ("twenty twenty", "2020"),
        ("the twenty first of May", "the 21st of may"),
        ("the third time", "the 3rd time"),
        ("two point five percent", "2.5%"),
        ("three point one four", "3.14"),
        ("five dollars", "$5"),
        ("ten of clubs", "10 of clubs"),
    ],
)
def test_spelled_and_written_numbers_match(spoken, written):
    assert normalize(spoken) == normalize(written)


def test_number_runs_stop_at_punctuation_and_separate_digits():
    assert normalize("one hundred and five, a hundred, three thousand") == "105 100 3000"
    assert normalize("five five") == "5 5"
    assert normalize("seven of hearts, four of clubs") == "7 of hearts 4 of clubs"


def test_words_that_only_look_like_numbers_are_kept():
    assert normalize("thousands of hundreds") == "thousands of hundreds"
    assert normalize("oh well") == "oh well"
    assert normalize("at point blank") == "at point blank"


def test_wer_counts_after_normalisation():
    assert wer(["Mr. Smith has three cats."], ["mister smith has 3 cats"]) == 0.0
    assert wer(["a b c d"], ["a x c"]) == pytest.approx(0.5)  # 1 substitution + 1 deletion
    # corpus level: total edits / total reference words
    assert wer(["a b", "c d e f"], ["a b", "c"]) == pytest.approx(3 / 6)


def test_wer_without_jiwer_matches(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_jiwer(name, *args, **kwargs):
        if name == "jiwer":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    refs, hyps = ["the cat sat on the mat", "hello there"], ["the cat sat on mat", "hello their friend"]
    expected = wer(refs, hyps)
    monkeypatch.setattr(builtins, "__import__", no_jiwer)
    assert wer(refs, hyps) == pytest.approx(expected)
    assert expected == pytest.approx(3 / 8)


def test_wer_handles_empty_strings_and_checks_lengths():
    assert wer(["", "a b"], ["x", "a b"]) == pytest.approx(1 / 2)
    with pytest.raises(ValueError):
        wer(["a"], [])
    with pytest.raises(ValueError):
        wer([""], ["a"])
    assert word_errors("a b c", "a c") == (1, 3)
