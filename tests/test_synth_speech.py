"""Synthesis of the training speech: manifest rows, resume, plan check, voices, throughput record.
Offline: the text is a tiny story file; flite (and festival, where installed) read it."""

import json
import os
import shutil
import subprocess

import pytest
from test_texts import STORY

from tools import augment as aug
from pipeline import synth_speech as ss
from pipeline import texts as tx

HAS_FLITE = shutil.which("flite") is not None
needs_flite = pytest.mark.skipif(not HAS_FLITE, reason="flite not installed (apt-get install flite)")
FLITE_VOICES = "slt:3,rms:2,awb:2,kal16:2"  # explicit, so a machine's festival voices do not change the tests


def _run(tmp_path, out, n, *extra):
    text = tmp_path / "story.txt"
    text.write_text(STORY)
    refs = tmp_path / "refs.jsonl"
    if not refs.exists():
        refs.write_text(json.dumps({"text": "ten of clubs"}) + "\n")
    voices = [] if "--voices" in extra else ["--voices", FLITE_VOICES]
    return ss.main(["--out", str(out), "--text-file", str(text), "--num-utterances", str(n), "--workers", "2",
                    "--shard-size", "2", "--seed", "3", "--quiet", "--exclude-references", str(refs),
                    *voices, *extra])


def _rows(out):
    return [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]


@needs_flite
def test_synthesize_resume_and_plan_check(tmp_path, capsys):
    import soundfile as sf

    out = tmp_path / "synth"
    assert _run(tmp_path, out, 4) == 0
    rows = _rows(out)
    assert len(rows) == 4
    for row in rows:
        assert set(row) >= {"id", "audio", "text", "voice", "engine", "rate", "duration", "source", "licence",
                            "augment"}
        info = sf.info(out / row["audio"])
        assert (info.samplerate, info.channels, info.subtype) == (16000, 1, "PCM_16")
        assert ss.MIN_SECONDS <= row["duration"] <= ss.MAX_SECONDS
        assert abs(info.frames / 16000 - row["duration"]) < 1e-3
        assert row["audio"].startswith("shard_") and row["voice"] in {"slt", "rms", "awb", "kal16"}
        assert row["source"] == "file" and row["licence"].startswith("text: unknown (user-supplied text); audio:")
    assert not list(out.rglob(".*.wav")) and not list(out.rglob("*.tmp-*"))
    mtimes = {r["id"]: os.path.getmtime(out / r["audio"]) for r in rows}

    assert _run(tmp_path, out, 5) == 0  # resume: one more clip, the first four untouched
    rows = _rows(out)
    assert len(rows) == 5
    assert all(os.path.getmtime(out / r["audio"]) == mtimes[r["id"]] for r in rows if r["id"] in mtimes)
    assert len(json.loads((out / "synth_info.json").read_text())["runs"]) == 2
    capsys.readouterr()

    assert _run(tmp_path, out, 5, "--voices", "slt") == 1  # other settings: refuse to mix
    assert "different settings (voices)" in capsys.readouterr().err
    assert _run(tmp_path, out, 5, "--augment", "none") == 1
    assert "different settings (augment)" in capsys.readouterr().err


@needs_flite
def test_rows_record_the_planned_augmentation_and_plan_the_sources(tmp_path):
    out = tmp_path / "synth"
    assert _run(tmp_path, out, 3, "--noise-fraction", "1", "--speed-fraction", "1") == 0
    config = aug.make_config("default", noise_fraction=1.0, speed_fraction=1.0)
    for row in _rows(out):
        assert row["augment"] == aug.plan_augmentation(row["id"], 3, config)
        assert "noise" in row["augment"] and "speed" in row["augment"]
    plan = json.loads((out / "plan.json").read_text())
    assert plan["augment"]["noise_fraction"] == 1.0 and plan["texts"] == "file:1"
    (source,) = plan["text_sources"]
    assert source["name"] == "file" and source["sentences"] == plan["num_sentences"] > 0
    assert source["licence"] == "unknown (user-supplied text)"
    assert {v["name"] for v in plan["voice_info"]} == {"slt", "rms", "awb", "kal16"}
    assert all("BSD" in v["licence"] for v in plan["voice_info"])
    assert plan["evaluation_exclusion"]["references"] == 1

    (run,) = json.loads((out / "synth_info.json").read_text())["runs"]
    assert run["utterances"] == 3 and run["utterances_per_second"] > 0 and run["audio_seconds_per_second"] > 0
    assert sum(v["utterances"] for v in run["by_voice"].values()) == 3 and set(run["by_engine"]) == {"flite"}


def test_evaluation_sentences_are_excluded_and_exports_keep_their_sources(tmp_path, capsys):
    story = tmp_path / "story.txt"
    story.write_text(STORY)
    refs = tmp_path / "refs.jsonl"
    refs.write_text(json.dumps({"text": "the baker had opened his shop early that day"}) + "\n")
    exported = tmp_path / "sentences.txt"
    assert ss.main(["--text-file", str(story), "--exclude-references", str(refs),
                    "--export-sentences", str(exported)]) == 0
    sentences = exported.read_text().splitlines()
    everything = tx.sentences_from_lines(STORY.splitlines())
    assert sentences == [s for s in everything if "baker" not in s] and len(sentences) == len(everything) - 1
    meta = json.loads((tmp_path / "sentences.txt.source.json").read_text())
    assert meta["texts"] == "file:1" and meta["sources"][0]["excluded_as_evaluation_text"] == 1

    args = ss.build_parser().parse_args(["--text-file", str(exported), "--exclude-references", str(refs)])
    sources, spec, _ = ss.text_sources(args, tmp_path)
    assert spec == "file:1" and sources[0].sentences == sentences
    args = ss.build_parser().parse_args(["--text-file", str(exported), "--texts", "austen:1",
                                         "--exclude-references", str(refs)])
    with pytest.raises(ss.SynthError, match="lacks"):
        ss.text_sources(args, tmp_path)


def test_exported_multi_source_file_splits_back_by_source(tmp_path):
    exported = tmp_path / "mix.txt"
    exported.write_text("A first sentence of the first source.\nA second one.\nThe other source speaks.\n")
    meta = {"texts": "one:2,two:1", "sources": [{"name": "one", "licence": "L1", "sentences": 2},
                                                 {"name": "two", "licence": "L2", "sentences": 1}]}
    (tmp_path / "mix.txt.source.json").write_text(json.dumps(meta))
    groups, spec = ss.file_sources(exported, "unused")
    assert spec == "one:2,two:1"
    assert [(name, len(sentences)) for name, sentences, _ in groups] == [("one", 2), ("two", 1)]
    exported.write_text("Only one sentence is left.\n")
    with pytest.raises(ss.SynthError, match="export it again"):
        ss.file_sources(exported, "unused")


def test_missing_reference_file_is_a_clear_error(tmp_path, capsys):
    code = ss.main(["--out", str(tmp_path / "o"), "--exclude-references", str(tmp_path / "none.jsonl")])
    assert code == 1 and "not found; fix: build it with `python -m pipeline.eval_speech`" in capsys.readouterr().err


def test_default_references_come_from_a_sibling_eval_speech(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "work" / "eval_speech").mkdir(parents=True)
    manifest = tmp_path / "work" / "eval_speech" / "manifest.jsonl"
    manifest.write_text(json.dumps({"text": "ten of clubs"}) + "\n")
    assert ss.default_reference_files(tmp_path / "work" / "train_speech") == [manifest]
    assert ss.default_reference_files(tmp_path / "elsewhere" / "train_speech") == []


# ----------------------------------------------------------------------------- voices


def _fake_flite(tmp_path, body='echo "boom" >&2; exit 3'):
    fake = tmp_path / "flite"
    fake.write_text('#!/bin/sh\nif [ "$1" = "-lv" ]; then echo "Voices available: kal awb_time kal16 awb rms slt"; '
                    f'exit 0; fi\n{body}\n')
    fake.chmod(0o755)
    return str(fake)


def test_auto_voices_take_flite_and_installed_festival(tmp_path, monkeypatch):
    synth = ss.Synthesizer(_fake_flite(tmp_path))
    monkeypatch.setattr(ss.Synthesizer, "festival_has", lambda self, voice: voice.name == "festival-ked")
    assert ss.resolve_voices("auto", synth) == [("slt", 3), ("rms", 2), ("awb", 2), ("kal16", 2), ("kal", 1),
                                                ("festival-ked", 1)]
    assert ss.resolve_voices("slt:2,festival-ked", synth) == [("slt", 2.0), ("festival-ked", 1.0)]
    with pytest.raises(ss.SynthError, match="apt-get install festival festvox-kallpc16k"):
        ss.resolve_voices("slt,festival-kal:1", synth)
    with pytest.raises(ss.SynthError, match="unknown voice"):
        ss.resolve_voices("awb_time", synth)
    with pytest.raises(ss.SynthError, match="bad --voices"):
        ss.resolve_voices("slt:0", synth)


def test_festival_commands_set_voice_and_rate(tmp_path):
    synth = ss.Synthesizer(_fake_flite(tmp_path), text2wave_bin="/usr/bin/text2wave")
    diphone = ss.Job(0, "x", "Hello there.", "festival-ked", 1.2, "shard_0000")
    cmd = synth.command(diphone, tmp_path / "o.wav", tmp_path / "t.txt")
    assert cmd[:3] == ["/usr/bin/text2wave", "-eval", "(voice_ked_diphone)"]
    assert "(Parameter.set 'Duration_Stretch 1.2)" in cmd
    hts = synth.command(ss.Job(0, "x", "Hi.", "festival-slt-hts", 1.25, "s"), tmp_path / "o.wav", tmp_path / "t")
    assert any('"-r" 0.8000' in part for part in hts)


@pytest.mark.skipif(not (HAS_FLITE and shutil.which("text2wave")), reason="festival not installed")
def test_festival_voice_synthesizes_when_installed(tmp_path):
    synth = ss.Synthesizer(None)
    if not synth.available(["festival-ked"]):
        pytest.skip("festvox-kdlpc16k not installed")
    job = ss.Job(0, "x0", "A short test sentence read by the festival diphone voice.", "festival-ked", 1.0,
                 "shard_0000", "file", {"noise": {"colour": "pink", "snr_db": 20.0}, "seed": 1})
    row = ss.run_job(job, tmp_path, synth)
    assert "rejected" not in row and row["engine"] == "festival" and (tmp_path / row["audio"]).is_file()


# ----------------------------------------------------------------------------- tools and errors


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


def test_missing_flite_is_a_clear_error(tmp_path, capsys, monkeypatch):
    code = _run(tmp_path, tmp_path / "o", 1, "--flite-bin", str(tmp_path / "no-flite"))
    assert code == 1 and "no-flite is not an executable" in capsys.readouterr().err
    real_which = shutil.which
    monkeypatch.setattr(ss.shutil, "which", lambda name, **kw: None if name == "flite" else real_which(name, **kw))
    with pytest.raises(ss.SynthError, match="flite not found"):
        ss.Synthesizer(None).check(["slt"])


@pytest.mark.skipif(not shutil.which("espeak-ng"), reason="espeak-ng not installed")
def test_espeak_voices_need_no_flite(tmp_path, monkeypatch):
    real_which = shutil.which
    monkeypatch.setattr(ss.shutil, "which", lambda name, **kw: None if name == "flite" else real_which(name, **kw))
    synth = ss.Synthesizer(None)
    synth.check(["espeak-fr"])
    job = ss.Job(0, "x0", "Veuillez saisir deux fois votre nouveau mot de passe, afin que nous puissions le vérifier.",
                 "espeak-fr", 1.0, "shard_0000", "file")
    assert "rejected" not in ss.run_job(job, tmp_path, synth)


def test_plan_is_deterministic():
    sources = [tx.LoadedSource("a", 1, [f"sentence number {i} is here for the test" for i in range(10)])]
    voices = ss.parse_voices("slt:2,rms:1")
    config = aug.PRESETS["default"]
    a = [ss.plan_job(i, tx.TextSchedule(sources, 7), 7, voices, 0.0, 3, config) for i in range(6)]
    schedule = tx.TextSchedule(sources, 7)
    b = [ss.plan_job(i, schedule, 7, voices, 0.0, 3, config) for i in range(6)]
    assert a == b and a[4].shard == "shard_0001" and all(j.rate in ss.RATES for j in a)
    assert all(j.source == "a" and j.augment == aug.plan_augmentation(j.id, 7, config) for j in a)
    with pytest.raises(ss.SynthError):
        ss.parse_voices("slt:0")


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
    _run(tmp_path, out, 1, "--flite-bin", _fake_flite(tmp_path))
    assert [p for p in stale if p.exists()] == [] and all(p.exists() for p in kept)


def test_failing_synthesizer_stops_with_a_clear_error(tmp_path, capsys):
    code = _run(tmp_path, tmp_path / "out", 2, "--flite-bin", _fake_flite(tmp_path))
    assert code == 1 and "rejected" in capsys.readouterr().err
    assert not (tmp_path / "out" / "manifest.jsonl").read_text()  # nothing kept, manifest still written


def test_espeak_voices_read_their_language_and_stay_out_of_auto(tmp_path, monkeypatch):
    synth = ss.Synthesizer(_fake_flite(tmp_path))
    synth.espeak = "/usr/bin/espeak-ng"
    monkeypatch.setattr(ss.Synthesizer, "espeak_voices", lambda self: {"de", "fr-fr"})
    monkeypatch.setattr(ss.Synthesizer, "festival_has", lambda self, voice: False)
    assert [v for v, _ in ss.resolve_voices("auto", synth)] == ["slt", "rms", "awb", "kal16", "kal"]
    assert ss.resolve_voices("espeak-de,espeak-fr:2", synth) == [("espeak-de", 1.0), ("espeak-fr", 2.0)]
    with pytest.raises(ss.SynthError, match="apt-get install espeak-ng"):
        ss.resolve_voices("espeak-nl", synth)
    cmd = synth.command(ss.Job(0, "x", "Guten Tag.", "espeak-fr", 1.25, "s"), tmp_path / "o.wav", tmp_path / "t")
    assert cmd == ["/usr/bin/espeak-ng", "-v", "fr-fr", "-s", "140", "-f", str(tmp_path / "t"),
                   "-w", str(tmp_path / "o.wav")]
    assert ss.VOICES["espeak-fr"].language == "fr" and ss.VOICES["slt"].language == "en"


@pytest.mark.skipif(not (HAS_FLITE and shutil.which("espeak-ng")), reason="espeak-ng not installed")
def test_espeak_voice_synthesizes_a_row_with_its_language(tmp_path):
    synth = ss.Synthesizer(None)
    synth.check(["espeak-de"])
    job = ss.Job(0, "x0", "Das Passwort darf nicht allgemein üblich sein, bitte wählen Sie ein anderes.",
                 "espeak-de", 1.0, "shard_0000", "file")
    row = ss.run_job(job, tmp_path, synth)
    assert "rejected" not in row and row["language"] == "de" and row["engine"] == "espeak-ng"
    assert (tmp_path / row["audio"]).is_file()


@pytest.mark.skipif(not (HAS_FLITE and shutil.which("espeak-ng") and shutil.which("ldd")), reason="espeak-ng not installed")
def test_espeak_bundle_carries_its_data_and_libraries(tmp_path):
    espeak = ss.make_espeak_bundle(tmp_path / "bundle", ["de"])
    data = tmp_path / "bundle" / "share" / "espeak-ng-data"
    assert (data / "de_dict").is_file() and not (data / "fr_dict").exists() and (data / "phondata").is_file()
    synth = ss.Synthesizer(None, espeak_bin=str(espeak))
    assert synth.env["ESPEAK_DATA_PATH"] == str(tmp_path / "bundle" / "share")
    assert str(tmp_path / "bundle" / "lib") in synth.env["LD_LIBRARY_PATH"]
    version = subprocess.run([synth.espeak, "--version"], capture_output=True, text=True, env=synth.env).stdout
    assert str(data) in version  # the bundle's data, not the system's
    job = ss.Job(0, "x0", "Bitte geben Sie Ihr neues Passwort zweimal ein, damit wir es prüfen können.",
                 "espeak-de", 1.0, "shard_0000", "file")
    row = ss.run_job(job, tmp_path / "out", synth)
    assert "rejected" not in row and (tmp_path / "out" / row["audio"]).is_file()
