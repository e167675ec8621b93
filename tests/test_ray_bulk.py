"""Bulk transcription on Ray Data (``tools.bulk``) on a local Ray instance with the real tiny.en artifact: the
rows' text is the single-process command's, a rerun skips what is written, a file that is not audio gets an error
row and the run goes on."""

import json

import pytest

from conftest import requires_transformers5
from scale_out_material import not_audio, single_process_records, speech_clips

ray = pytest.importorskip("ray")
pytestmark = requires_transformers5


@pytest.fixture(scope="module")
def cluster():
    from tools import bulk

    bulk.start_ray(num_cpus=2)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def material(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bulk")
    clips = speech_clips(folder / "audio")
    broken = not_audio(folder / "audio")
    return folder, clips, broken


def rows_by_path(output):
    from tools import bulk

    return {row["path"]: row for row in bulk.read_rows(str(output))}


def test_rows_equal_the_single_process_command_then_resume_skips(cluster, material):
    from tools import bulk

    folder, clips, broken = material
    expected = single_process_records(clips, folder / "single")
    output = folder / "rows"
    summary = bulk.bulk_transcribe([str(folder / "audio")], str(output), batch_size=2)
    assert (summary.inputs, summary.transcribed, summary.errors, summary.skipped) == (4, 3, 1, 0)
    rows = rows_by_path(output)
    for path, record in expected.items():
        row = rows[path]
        assert row["error"] is None and row["text"] == record["text"]
        assert [{k: s[k] for k in ("start", "end", "text")} for s in row["segments"]] == record["segments"]
        assert row["language"] == "english" and row["draft"] and row["audio_seconds"] > 1.0
        assert json.loads(row["options"])["model"].endswith("whisper-tiny.en")
    error = rows[str(broken.resolve())]
    assert error["text"] is None and "broken.wav: cannot decode audio" in error["error"]

    again = bulk.bulk_transcribe([str(folder / "audio")], str(output), batch_size=2)
    assert (again.transcribed, again.errors, again.skipped) == (0, 1, 3)  # the error row is retried


def test_parquet_table_of_paths_and_a_changed_option(cluster, material, tmp_path):
    """A Parquet table of paths in, Parquet rows out; a changed option transcribes again."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tools import bulk

    folder, clips, _ = material
    pq.write_table(pa.table({"path": [clips[0].name]}), folder / "audio" / "inputs.parquet")  # (relative path)
    output = tmp_path / "rows"
    first = bulk.bulk_transcribe([str(folder / "audio" / "inputs.parquet")], str(output), output_format="parquet")
    assert (first.transcribed, first.errors) == (1, 0)
    assert all(p.suffix == ".parquet" for p in output.iterdir())
    assert [r["path"] for r in bulk.read_rows(str(output))] == [str(clips[0].resolve())]
    other = bulk.bulk_transcribe([str(folder / "audio" / "inputs.parquet")], str(output), output_format="parquet",
                                 max_new_tokens=100)
    assert (other.transcribed, other.skipped) == (1, 0)


def test_command_line_errors_are_one_line(cluster, tmp_path, capsys):
    from tools import bulk

    code = bulk.main([str(tmp_path / "missing"), "--output", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: ") and "missing: no such file or folder" in err and len(err.splitlines()) == 1


def test_an_option_the_actors_refuse_is_one_line():
    """An actor's failed start reaches the driver as Ray's error holding the worker's traceback as text: the command
    says the ValueError's line alone."""
    from tools import bulk

    died = RuntimeError("The actor died because of an error raised in its creation task\nTraceback (most recent call "
                        "last):\n  File \"x.py\", line 1\nValueError: This Whisper model is English-only: it takes "
                        "no language or task; leave them unset.\n")
    assert bulk._user_error(died) == "This Whisper model is English-only: it takes no language or task; leave them unset."
    assert bulk._user_error(RuntimeError("something else")) is None
