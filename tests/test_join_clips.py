"""pipeline.join_clips: short clips joined in order into recordings of at most one Whisper window."""

from __future__ import annotations

import json

import numpy as np
import soundfile as sf

from pipeline import join_clips


def write_clips(folder, seconds):
    rows = []
    for i, length in enumerate(seconds):
        audio = np.full(int(length * 16000), (i + 1) / 10, dtype=np.float32)
        sf.write(folder / f"c{i}.wav", audio, 16000, subtype="PCM_16")
        rows.append({"id": f"c{i}", "audio": f"c{i}.wav", "text": f"t{i}", "duration": length,
                     "source": "s", "licence": "l"})
    (folder / "manifest.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder / "manifest.jsonl"


def test_clips_join_in_order_with_pauses_up_to_the_limit(tmp_path):
    manifest = write_clips(tmp_path, [1.0, 1.5, 0.5, 2.5, 4.0, 1.0])
    assert join_clips.run_cli(join_clips.main, ["--audio", str(manifest), "--out", str(tmp_path / "o"),
                                                "--max-seconds", "3", "--pause", "0.25"]) == 0
    rows = [json.loads(line) for line in (tmp_path / "o" / "manifest.jsonl").read_text().splitlines()]
    assert [r["clips"] for r in rows] == [["c0", "c1"], ["c2"], ["c3"], ["c5"]]  # c4 (4 s) is longer than a window
    assert [r["text"] for r in rows] == ["t0 t1", "t2", "t3", "t5"]
    assert [r["duration"] for r in rows] == [2.75, 0.5, 2.5, 1.0]
    audio, rate = sf.read(tmp_path / "o" / rows[0]["audio"], dtype="float32")
    assert rate == 16000
    expected = np.concatenate([np.full(16000, 0.1), np.zeros(4000), np.full(24000, 0.2)])
    assert np.allclose(audio, expected, atol=1e-4)


def test_window_longer_than_whisper_is_one_line(tmp_path, capsys):
    manifest = write_clips(tmp_path, [1.0])
    assert join_clips.run_cli(join_clips.main, ["--audio", str(manifest), "--out", str(tmp_path / "o"),
                                                "--max-seconds", "31"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
