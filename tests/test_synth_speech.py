import io
import json
import os
import shutil
import subprocess
import tarfile
import zlib

import pytest

from pipeline import synth_speech as ss

HAS_FLITE = shutil.which("flite") is not None
needs_flite = pytest.mark.skipif(not HAS_FLITE, reason="flite not installed (apt-get install flite)")

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


# ----------------------------------------------------------------------------- text


def test_clean_paragraph_removes_markup_and_headings():
    assert ss.clean_paragraph("CHAPTER I") is None
    assert ss.clean_paragraph("VOLUME II") is None
    text = ss.clean_paragraph('"Good morning," said _she_.--"Shall we go?" &c.')
    assert text == "Good morning, said she. Shall we go? et cetera"


def test_split_sentences_keeps_abbreviations():
    parts = ss.split_sentences("Mr. Smith met Mrs. Jones. They talked! Did they? Yes.")
    assert parts == ["Mr. Smith met Mrs. Jones.", "They talked!", "Did they?", "Yes."]


def test_fit_lengths_merges_short_and_splits_long():
    short = ["Yes.", "No, not at all.", "He went home and slept for the rest of the day."]
    merged = ss.fit_lengths(short, min_words=9, max_words=42)
    assert merged == ["Yes. No, not at all. He went home and slept for the rest of the day."]
    long = "; ".join(["the rain fell on the hills and the valleys all night"] * 8) + "."
    pieces = ss.fit_lengths([long], min_words=9, max_words=42)
    assert len(pieces) >= 2
    assert all(9 <= len(p.split()) <= 42 and p[0].isupper() and p.endswith(".") for p in pieces)


def test_sentences_from_lines_gives_speakable_sentences():
    sentences = ss.sentences_from_lines(STORY.splitlines())
    assert sentences and all(ss.MIN_WORDS <= len(s.split()) <= ss.MAX_WORDS for s in sentences)
    assert not any("CHAPTER" in s or '"' in s or "--" in s for s in sentences)


# ----------------------------------------------------------------------------- Debian package / R data


def _r_strings(values):
    out = [b"X\n", (3).to_bytes(4, "big"), (0x040201).to_bytes(4, "big"), (0x030500).to_bytes(4, "big"),
           (5).to_bytes(4, "big"), b"UTF-8", (16).to_bytes(4, "big"), len(values).to_bytes(4, "big")]
    for value in values:
        raw = value.encode()
        out += [(0x00040009).to_bytes(4, "big"), len(raw).to_bytes(4, "big"), raw]
    return b"".join(out)


def _rdb(records):
    return b"".join(len(p).to_bytes(4, "big") + zlib.compress(p) for p in map(_r_strings, records))


def _deb(files: dict[str, bytes]) -> bytes:
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
    deb = tmp_path / "r-cran-test_1.0-1_all.deb"
    deb.write_bytes(_deb({"./usr/lib/R/site-library/x/data/Rdata.rdb": _rdb(books), "./usr/share/doc/x": b"d"}))
    files = ss.deb_files(deb, ("data/Rdata.rdb",))
    assert list(files) == ["./usr/lib/R/site-library/x/data/Rdata.rdb"]
    assert ss.read_rdata_db(next(iter(files.values()))) == books


def test_austen_corpus_if_obtainable():
    try:
        sentences, origin = ss.corpus_sentences()
    except ss.SynthError as exc:
        pytest.skip(f"Jane Austen corpus not obtainable here: {exc}")
    assert len(sentences) >= 10000
    assert origin["books"] and "sense and sensibility" not in origin["books"]
    assert not any("Dashwood" in s for s in sentences[:5000])


# ----------------------------------------------------------------------------- synthesis


def _run(tmp_path, out, n, *extra):
    text = tmp_path / "story.txt"
    text.write_text(STORY)
    return ss.main(["--out", str(out), "--text-file", str(text), "--num-utterances", str(n), "--workers", "2",
                    "--shard-size", "2", "--seed", "3", "--quiet", *extra])


@needs_flite
def test_synthesize_resume_and_plan_check(tmp_path, capsys):
    import soundfile as sf

    out = tmp_path / "synth"
    assert _run(tmp_path, out, 4) == 0
    rows = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]
    assert len(rows) == 4
    for row in rows:
        assert set(row) >= {"id", "audio", "text", "voice", "rate", "duration", "source", "licence"}
        info = sf.info(out / row["audio"])
        assert (info.samplerate, info.channels, info.subtype) == (16000, 1, "PCM_16")
        assert ss.MIN_SECONDS <= row["duration"] <= ss.MAX_SECONDS
        assert abs(info.frames / 16000 - row["duration"]) < 1e-3
        assert row["audio"].startswith("shard_") and row["voice"] in {"slt", "rms", "awb", "kal16"}
    assert not list(out.rglob(".*.wav")) and not list(out.rglob("*.tmp-*"))
    mtimes = {r["id"]: os.path.getmtime(out / r["audio"]) for r in rows}

    assert _run(tmp_path, out, 5) == 0  # resume: one more clip, the first four untouched
    rows = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]
    assert len(rows) == 5
    assert all(os.path.getmtime(out / r["audio"]) == mtimes[r["id"]] for r in rows if r["id"] in mtimes)
    capsys.readouterr()

    assert _run(tmp_path, out, 5, "--voices", "slt") == 1  # other settings: refuse to mix
    assert "different settings" in capsys.readouterr().err


@needs_flite
def test_flite_bundle_runs(tmp_path):
    if shutil.which("ldd") is None:
        pytest.skip("ldd not available")
    flite = ss.make_flite_bundle(tmp_path / "bundle")
    assert (tmp_path / "bundle" / "lib").is_dir() and any((tmp_path / "bundle" / "lib").iterdir())
    synth = ss.Synthesizer(str(flite))
    assert str(tmp_path / "bundle" / "lib") in synth.env["LD_LIBRARY_PATH"]
    synth.check(["slt"])
    job = ss.Job(0, "x0", "A short test sentence for the bundled flite binary.", "slt", 1.0, "shard_0000")
    row = ss.run_job(job, tmp_path / "out", synth)
    assert "rejected" not in row and (tmp_path / "out" / row["audio"]).is_file()


def test_missing_flite_is_a_clear_error(tmp_path, capsys):
    text = tmp_path / "story.txt"
    text.write_text(STORY)
    code = ss.main(["--out", str(tmp_path / "o"), "--text-file", str(text), "--num-utterances", "1",
                    "--flite-bin", str(tmp_path / "no-flite")])
    assert code == 1 and "flite not found" in capsys.readouterr().err


def test_plan_is_deterministic():
    sentences = [f"sentence number {i} is here for the test" for i in range(10)]
    order = list(range(10))
    voices = ss.parse_voices("slt:2,rms:1")
    a = [ss.plan_job(i, sentences, order, 7, voices, 0.0, 3) for i in range(6)]
    b = [ss.plan_job(i, sentences, order, 7, voices, 0.0, 3) for i in range(6)]
    assert a == b and a[4].shard == "shard_0001" and all(j.rate in ss.RATES for j in a)
    with pytest.raises(ss.SynthError):
        ss.parse_voices("slt:0")


def failing_flite(folder):
    fake = folder / "flite"
    fake.write_text('#!/bin/sh\nif [ "$1" = "-lv" ]; then echo "Voices available: slt rms awb kal16"; exit 0; fi\n'
                    'echo "boom" >&2; exit 3\n')
    fake.chmod(0o755)
    return fake


def test_temp_files_of_a_killed_run_are_removed_by_the_next(tmp_path):
    """kill -9 skips a run's clean-up: the next run removes temp files whose process is gone, and keeps
    those of a live process and the resume log."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    out = tmp_path / "out"
    (out / "shard_0000").mkdir(parents=True)
    stale = [out / "shard_0000" / f".x0.raw-{dead.pid}.wav", out / "shard_0000" / f".x1.text-{dead.pid}.txt",
             out / "shard_0000" / f".x2.wav.tmp-{dead.pid}-7", out / f".manifest.jsonl.tmp-{dead.pid}"]
    kept = [out / "shard_0000" / f".x3.raw-{os.getpid()}.wav", out / "shard_0000" / ".rows.jsonl"]
    for path in stale + kept:
        path.write_text("")
    _run(tmp_path, out, 1, "--flite-bin", str(failing_flite(tmp_path)))
    assert [p for p in stale if p.exists()] == [] and all(p.exists() for p in kept)


def test_failing_synthesizer_stops_with_a_clear_error(tmp_path, capsys):
    fake = failing_flite(tmp_path)
    code = _run(tmp_path, tmp_path / "out", 2, "--flite-bin", str(fake))
    assert code == 1 and "rejected" in capsys.readouterr().err
    assert not (tmp_path / "out" / "manifest.jsonl").read_text()  # nothing kept, manifest still written
