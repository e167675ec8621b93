"""The multilingual evaluation set: sentences from gettext catalogues, the per-language manifests joined into
one, and the heads-comparison summary rows made from benchmark results. Offline: catalogues and results are
written here."""

import json
from pathlib import Path

import pytest

from pipeline import eval_speech, multilingual_texts as mt, synth_speech as ss
from tools import heads_summary as hs

CATALOGUE = r'''# German translation
msgid ""
msgstr ""
"Content-Type: text/plain; charset=UTF-8\n"

#: contrib/admin/forms.py:20
msgid "Please enter the correct username and password for a staff account."
msgstr ""
"Bitte einen gültigen Benutzernamen und ein Passwort eingeben, beide "
"Felder berücksichtigen die Groß-/Kleinschreibung"

msgid "Hello %(name)s, your account has been disabled by the admin."
msgstr "Hallo %(name)s, Ihr Konto wurde von der Verwaltung deaktiviert."

msgctxt "month name"
msgid "May"
msgstr "Mai"

msgid "%(count)d item was deleted."
msgid_plural "%(count)d items were deleted."
msgstr[0] "Ein Eintrag wurde gelöscht, wie Sie es gewünscht haben."
msgstr[1] "Einträge wurden gelöscht, wie Sie es gewünscht haben."

msgid "This password is too common to be used here."
msgstr "Dieses Passwort ist zu üblich, um hier verwendet zu werden."
'''


def test_po_entries_join_lines_and_skip_header_and_plurals():
    entries = mt.po_entries(CATALOGUE)
    assert [m for m, _ in entries] == [
        "Please enter the correct username and password for a staff account.",
        "Hello %(name)s, your account has been disabled by the admin.", "May",
        "This password is too common to be used here."]
    assert entries[0][1] == ("Bitte einen gültigen Benutzernamen und ein Passwort eingeben, beide "
                             "Felder berücksichtigen die Groß-/Kleinschreibung")
    assert mt.po_entries('msgid "a \\"quoted\\" word"\nmsgstr "ein \\"zitiertes\\" Wort"\n') == [
        ('a "quoted" word', 'ein "zitiertes" Wort')]


@pytest.mark.parametrize("message, expected", [
    ("Dieses Passwort ist zu üblich, um hier verwendet zu werden.", "Dieses Passwort ist zu üblich, um hier verwendet zu werden."),
    ("Ce numéro de page n’est pas un nombre entier", "Ce numéro de page n'est pas un nombre entier."),
    ("Значение должно состоять только из латинских букв и цифр.", "Значение должно состоять только из латинских букв и цифр."),
    ("Hallo %(name)s, Ihr Konto wurde von der Verwaltung deaktiviert.", None),  # placeholder
    ("Geben Sie <b>hier</b> einen gültigen Wert für das Feld ein.", None),  # markup
    ("Die Seitenzahl ist kleiner als 1 und damit ungültig.", None),  # a digit
    ("Siehe https://example.org für weitere Hinweise zu diesem Feld.", None),  # URL
    ("Zu kurz zum Lesen.", None),  # fewer than MIN_WORDS words
    ("Ce champ ne doit contenir que des lettres et des tirets bas (_).", None),  # a symbol spelled out
    ("Veuillez vous rendre sur cette page et choisir un nouveau mot de passe :",
     "Veuillez vous rendre sur cette page et choisir un nouveau mot de passe."),
])
def test_speakable_keeps_plain_sentences_only(message, expected):
    assert mt.speakable(message) == expected


def test_django_sentences_take_one_locale_once_in_catalogue_order():
    files = {"django/conf/locale/de/LC_MESSAGES/django.po": CATALOGUE.encode(),
             "django/contrib/admin/locale/de/LC_MESSAGES/django.po": CATALOGUE.encode(),
             "django/conf/locale/de_CH/LC_MESSAGES/django.po": (
                 'msgid "x y"\nmsgstr "Ein Satz aus der Schweiz, der nicht zur Auswahl gehört."\n').encode()}
    # the first message's "Groß-/Kleinschreibung" holds a slash, which a voice would read out
    assert mt.django_sentences(files, "de") == ["Dieses Passwort ist zu üblich, um hier verwendet zu werden."]
    with pytest.raises(Exception):
        mt.parse_languages("de,xx")
    assert mt.parse_languages("de, fr") == ["de", "fr"]


def test_language_file_is_a_synth_speech_text_file(tmp_path):
    sentences = ["Dieses Passwort ist zu üblich, um hier verwendet zu werden.",
                 "Bitte geben Sie einen gültigen Namen für das neue Konto ein."]
    path = mt.write_language(tmp_path, "de", sentences)
    groups, spec = ss.file_sources(path, "unknown")
    assert spec == "django-de:1"
    [(name, read, info)] = groups
    assert name == "django-de" and read == sentences
    assert info["licence"].startswith("BSD-3-Clause") and info["package"] == mt.DJANGO and info["language"] == "de"


def _manifest(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


def test_combined_manifest_prefixes_ids_and_audio_by_language(tmp_path):
    _manifest(tmp_path / "de" / "manifest.jsonl", [{"id": "syn0000000", "audio": "shard_0000/syn0000000.wav",
                                                    "text": "Guten Tag.", "language": "de"}])
    _manifest(tmp_path / "fr" / "manifest.jsonl", [{"id": "syn0000000", "audio": "shard_0000/syn0000000.wav",
                                                    "text": "Bonjour."}])
    rows = eval_speech.combined_rows(tmp_path, ["de", "fr"])
    assert [(r["id"], r["audio"], r["language"]) for r in rows] == [
        ("de-syn0000000", "de/shard_0000/syn0000000.wav", "de"), ("fr-syn0000000", "fr/shard_0000/syn0000000.wav", "fr")]


def _results(manifest: str, language: str | None, device: str = "cpu", timestamps: bool = False) -> dict:
    return {"environment": {"device": device},
            "settings": {"model": "heads/whisper-base", "base_model": "/cache/whisper-base",
                         "base_model_declared": "openai/whisper-base", "manifest": manifest, "language": language,
                         "timestamps": timestamps, "draft": "tree-32", "medusa_num_layers": 1,
                         "command": "python -m tools.benchmark --draft tree-32"},
            "summary": {"clips": 20, "mean_accepted_per_round": 1.234567, "exact_match_rate": 1.0,
                        "e2e_speedup_vs_own_greedy": 0.91234, "draft_ran": "tree-32", "baseline_wer": 0.5}}


def test_summary_rows_name_language_and_device(tmp_path):
    config = {"head_kind": "path", "speech_attention": True, "medusa_num_layers": 1}
    forced = hs.summary_row(_results("m.jsonl", "de"), "r.json", None, None, config)
    assert forced["variant"] == "heads/whisper-base (path-speech, 1 layer)" and forced["base"] == "openai/whisper-base"
    assert (forced["language"], forced["language_forced"], forced["tokens_per_pass"]) == ("de", True, 1.2346)
    assert forced["cpu_speedup_vs_own_greedy"] == 0.9123 and forced["gpu_speedup_vs_own_greedy"] is None
    detected = hs.summary_row(_results("m.jsonl", None, device="cuda:0"), "r.json", "fr", None, config)
    assert (detected["language"], detected["language_forced"]) == ("fr", False)
    assert detected["gpu_speedup_vs_own_greedy"] == 0.9123 and detected["cpu_speedup_vs_own_greedy"] is None
    with pytest.raises(hs.SummaryError, match="--default-language"):
        hs.summary_row(_results("m.jsonl", None), "r.json", None, None, config)
    assert hs.summary_row(_results("m.jsonl", None), "r.json", None, "en", config)["language"] == "en"


def _clip(clip_id: str, emitted: int, passes: int, greedy_ms: float, medusa_ms: float, exact: bool = True) -> dict:
    return {"id": clip_id, "reference": "ein zwei drei", "exact_match": exact, "draft_ran": "tree-32",
            "baseline": {"text": "ein zwei drei"}, "greedy": {"latency_ms_median": greedy_ms},
            "medusa": {"latency_ms_median": medusa_ms, "stats": {"emitted_tokens": emitted, "row_rounds": passes}}}


def test_a_run_over_several_languages_gives_a_row_per_language(tmp_path):
    results = _results("all.jsonl", None)
    results["clips"] = [_clip("de-1", 10, 8, 1000, 900), _clip("fr-1", 12, 6, 1000, 700, exact=False),
                        _clip("de-2", 6, 4, 500, 600)]
    languages = {"de-1": "de", "de-2": "de", "fr-1": "fr"}
    de, fr = hs.rows_of_run(results, "r.json", languages, None, {"head_kind": "path"})
    assert (de["language"], de["clips"], de["tokens_per_pass"], de["exact_match_rate"]) == ("de", 2, 1.3333, 1.0)
    assert de["cpu_speedup_vs_own_greedy"] == round(1500 / 1500, 4) and de["wer"] == 0.0
    assert (fr["language"], fr["tokens_per_pass"], fr["exact_match_rate"], fr["cpu_speedup_vs_own_greedy"]) == (
        "fr", 2.0, 0.0, round(1000 / 700, 4))
    assert not de["language_forced"]
    with pytest.raises(hs.SummaryError, match="forced"):
        hs.rows_of_run(_results("all.jsonl", "de") | {"clips": results["clips"]}, "r.json", languages, None)
    [one] = hs.rows_of_run(_results("de.jsonl", None), "r.json", {"de-1": "de"}, None)
    assert one["language"] == "de" and one["tokens_per_pass"] == 1.2346  # the run's own summary


def test_manifest_languages_by_clip(tmp_path):
    _manifest(tmp_path / "a.jsonl", [{"id": "1", "language": "de"}, {"id": 2}])
    assert hs.manifest_languages(tmp_path / "a.jsonl") == {"1": "de", "2": None}
    assert hs.manifest_languages(tmp_path / "missing.jsonl") == {}


def test_summary_file_replaces_rows_of_the_same_key(tmp_path):
    manifest = tmp_path / "de.jsonl"
    _manifest(manifest, [{"id": "1", "language": "de"}])
    first = tmp_path / "first.json"
    first.write_text(json.dumps(_results(str(manifest), None)))
    again = _results(str(manifest), None)
    again["summary"]["mean_accepted_per_round"] = 1.5
    second = tmp_path / "second.json"
    second.write_text(json.dumps(again))
    forced = tmp_path / "forced.json"
    forced.write_text(json.dumps(_results(str(manifest), "de", timestamps=True)))
    summary = tmp_path / "summary.json"
    assert hs.main(["--results", str(first), str(forced), "--summary", str(summary)]) == 0
    assert hs.main(["--results", str(second), "--summary", str(summary)]) == 0
    rows = json.loads(summary.read_text())["rows"]
    assert [(r["language_forced"], r["timestamps"], r["tokens_per_pass"], r["results"]) for r in rows] == [
        (False, False, 1.5, str(second)), (True, True, 1.2346, str(forced))]


def test_a_results_file_measured_again_from_the_heads_new_folder_replaces_its_row(tmp_path):
    manifest = tmp_path / "en.jsonl"
    _manifest(manifest, [{"id": "1", "language": "en"}])
    run, summary = tmp_path / "run.json", tmp_path / "summary.json"
    for folder in ("work_data/artifacts/tuned", "heads/tuned"):  # the same file, measured again after shipping
        results = _results(str(manifest), None)
        results["settings"]["model"] = folder
        run.write_text(json.dumps(results))
        assert hs.main(["--results", str(run), "--summary", str(summary)]) == 0
    [row] = json.loads(summary.read_text())["rows"]
    assert row["variant"].startswith("heads/tuned")


def test_heads_measured_again_with_another_draft_show_the_latest_measurement():
    config = {"head_kind": "path", "speech_attention": True, "medusa_num_layers": 1}
    older = hs.summary_row(_results("m.jsonl", "de"), "old.json", None, None, config)
    gpu = {**older, "gpu": "NVIDIA H100", "results": "gpu.json"}
    timestamped = hs.summary_row(_results("m.jsonl", "de", timestamps=True), "ts.json", None, None, config)
    newer = {**older, "draft": "tree-16", "results": "new.json"}
    assert [r["results"] for r in hs.latest_rows([older, gpu, timestamped, newer])] == ["new.json", "gpu.json", "ts.json"]
    exported = {**older, "variant": "work_data/artifacts/whisper-base (path-speech, 1 layer)", "results": "w.json"}
    assert [r["results"] for r in hs.latest_rows([exported, older])] == ["old.json"]  # shipped as heads/whisper-base


def _page(*paragraphs: str) -> bytes:
    body = "".join(f"<p>{p}</p>" for p in paragraphs)
    return f'<page xmlns="http://projectmallard.org/1.0/" id="x"><title>T</title>{body}</page>'.encode()


def test_gnome_help_sentences_drop_untranslated_and_excluded_ones():
    files = {
        "./usr/share/help/C/gnome-help/a.page": _page("Press the key twice to turn the screen reader on and off."),
        "./usr/share/help/de/gnome-help/a.page": _page(
            "Drücken Sie die Taste <gui>zweimal</gui>, um den Bildschirmleser einzuschalten. Zu kurz hier.",
            "Press the key twice to turn the screen reader on and off."),  # left untranslated
        "./usr/share/help/de/gnome-help/b.page": _page("Dieses Passwort ist zu üblich, um hier verwendet zu werden.",
                                                       "Öffnen Sie die Einstellungen und wählen Sie den Reiter Maus aus."),
        "./usr/share/help/de/gnome-help/broken.page": b"<page><p>unclosed",
    }
    assert mt.gnome_help_sentences(files, "de", exclude={"Dieses Passwort ist zu üblich, um hier verwendet zu werden."}) == [
        "Drücken Sie die Taste zweimal, um den Bildschirmleser einzuschalten.",
        "Öffnen Sie die Einstellungen und wählen Sie den Reiter Maus aus."]


def test_gnome_help_file_records_its_debian_source(tmp_path):
    path = mt.write_language(tmp_path, "fr", ["Ouvrez les paramètres et choisissez l'onglet Souris."], "gnome-help", "43.0-2")
    [(name, _, info)], spec = ss.file_sources(path, "unknown")
    assert (name, spec, info["registry"], info["package"], info["version"]) == (
        "gnome-help-fr", "gnome-help-fr:1", "debian", "gnome-user-docs", "43.0-2")
    assert info["licence"].startswith("CC-BY-SA-3.0")


def test_heads_named_here_replace_the_lent_machines_folder_in_the_variant(tmp_path):
    """A run on a lent machine names its copy of the heads; ``--heads`` names them as kept here (path and recipe)."""
    heads = tmp_path / "artifacts" / "tuned"
    heads.mkdir(parents=True)
    (heads / "config.json").write_text(json.dumps({"head_kind": "path", "speech_attention": True,
                                                   "medusa_num_layers": 1}))
    remote = tmp_path / "remote.json"
    remote.write_text(json.dumps(_results("/tmp/w/eval/manifest.jsonl", None, device="cuda")))
    summary = tmp_path / "summary.json"
    assert hs.main(["--results", str(remote), "--summary", str(summary), "--default-language", "en",
                    "--heads", str(heads)]) == 0
    [row] = json.loads(summary.read_text())["rows"]
    assert row["variant"] == f"{heads} (path-speech, 1 layer)"
    assert row["command"] == "python -m tools.benchmark --draft tree-32"  # the run's own command
