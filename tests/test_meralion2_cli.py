"""The transcription command on a MERaLiON-2 artifact (tiny stand-in, transformers 4.51): 40 s of audio in the
default 30 s windows (cut at voice-activity pauses), or with ``--window-seconds 60`` in one window through the
processor's multi-chunk prompt; either way the transcript is the same with and without Medusa."""

import json

import numpy as np
import pytest

from conftest import transformers_below_452

pytestmark = pytest.mark.skipif(not transformers_below_452(),
                                reason="MERaLiON-2's remote code runs on transformers ~4.51 only")


@pytest.mark.parametrize("window_seconds", [None, 60.0])
def test_cli_transcribes_multi_chunk_audio_identically_with_and_without_medusa(tmp_path, window_seconds):
    import soundfile as sf

    from tools import transcribe
    from modeling_medusa import MedusaForASR
    from standin import build_meralion2_standin

    base = build_meralion2_standin(tmp_path / "base", seed=0)
    artifact = MedusaForASR.from_base(str(base), family="meralion2", trust_base_remote_code=True)
    artifact.save_pretrained(tmp_path / "artifact")
    rng = np.random.default_rng(0)
    for name, seconds in (("long.wav", 40.0), ("short.wav", 4.0)):
        sf.write(tmp_path / name, (rng.standard_normal(int(16000 * seconds)) * 0.1).astype(np.float32), 16000)
    common = [str(tmp_path / "long.wav"), str(tmp_path / "short.wav"), "--model", str(tmp_path / "artifact"),
              "--format", "json", "--batch-size", "2", "--max-new-tokens", "24",
              *(["--window-seconds", str(window_seconds)] if window_seconds else [])]
    assert transcribe.main(common + ["--output", str(tmp_path / "medusa")]) == 0
    assert transcribe.main(common + ["--output", str(tmp_path / "plain"), "--no-medusa"]) == 0
    for name in ("long.json", "short.json"):
        medusa = json.loads((tmp_path / "medusa" / name).read_text())
        plain = json.loads((tmp_path / "plain" / name).read_text())
        assert medusa["text"] and medusa["text"] == plain["text"]
    assert json.loads((tmp_path / "medusa" / "long.json").read_text())["duration_seconds"] == pytest.approx(40.0)


def test_cli_refuses_whisper_language_options_for_meralion2(tmp_path, capsys):
    import soundfile as sf

    from tools import transcribe
    from modeling_medusa import MedusaForASR
    from standin import build_meralion2_standin

    base = build_meralion2_standin(tmp_path / "base", seed=0)
    artifact = MedusaForASR.from_base(str(base), family="meralion2", trust_base_remote_code=True)
    artifact.save_pretrained(tmp_path / "artifact")
    sf.write(tmp_path / "a.wav", np.zeros(16000, np.float32), 16000)
    code = transcribe.main([str(tmp_path / "a.wav"), "--model", str(tmp_path / "artifact"),
                                   "--language", "en", "--output", str(tmp_path / "out")])
    assert code == transcribe.EXIT_USER_ERROR
    assert "MERaLiON-2 takes an instruction instead" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
