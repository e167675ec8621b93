"""The OpenAI-compatible endpoint on Ray Serve (``tools.serve``) with the real tiny.en artifact, through the
official ``openai`` client on 127.0.0.1: every response format, errors as 4xx with the server still serving, and 16
concurrent clients answered with the single-process command's text."""

import json
import socket
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import requires_transformers5
from scale_out_material import not_audio, single_process_records, speech_clips

ray = pytest.importorskip("ray")
openai = pytest.importorskip("openai")
pytestmark = requires_transformers5
MODEL = "whisper-tiny.en"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    from ray import serve

    from tools import bulk, serve as serving

    bulk.start_ray(num_cpus=2)
    port = free_port()
    serving.start(None, host="127.0.0.1", port=port, max_batch_size=16, batch_wait_s=0.1)
    yield openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=120)
    serve.shutdown()
    ray.shutdown()


@pytest.fixture(scope="module")
def material(tmp_path_factory):
    folder = tmp_path_factory.mktemp("serve")
    clips = speech_clips(folder / "audio")
    return folder, clips, single_process_records(clips, folder / "single")


def transcribe(client, path, **options):
    with open(path, "rb") as handle:
        return client.audio.transcriptions.create(file=handle, model=MODEL, **options)


def test_every_response_format(server, material):
    import srt
    import webvtt

    folder, clips, expected = material
    record = expected[str(clips[1].resolve())]
    assert transcribe(server, clips[1]).text == record["text"]
    assert transcribe(server, clips[1], response_format="text").strip() == record["text"]
    cues = list(srt.parse(transcribe(server, clips[1], response_format="srt")))
    assert " ".join(c.content.replace("\n", " ") for c in cues).split() == record["text"].split()
    (folder / "a.vtt").write_text(transcribe(server, clips[1], response_format="vtt"))
    assert " ".join(c.text.replace("\n", " ") for c in webvtt.read(str(folder / "a.vtt"))).split() == \
        record["text"].split()
    verbose = transcribe(server, clips[1], response_format="verbose_json")
    assert verbose.language == "english" and verbose.duration > 1.0 and verbose.text == record["text"]
    assert [(s.start, s.end, s.text) for s in verbose.segments] == \
        [(s["start"], s["end"], s["text"]) for s in record["segments"]]
    assert "medusa greedy" in verbose.model_extra["decoding"]
    words = transcribe(server, clips[1], response_format="verbose_json", timestamp_granularities=["word"])
    assert "".join(w.word for w in words.words) == "".join(record["text"].split())
    assert all(a.start <= b.start for a, b in zip(words.words, words.words[1:]))


def test_temperature_above_zero_says_it_fell_back(server, material):
    _, clips, _ = material
    response = server.audio.transcriptions.with_raw_response.create(
        file=open(clips[0], "rb"), model=MODEL, temperature=0.5, response_format="verbose_json")
    assert "temperature 0.5" in response.headers["x-medusa-decoding"]
    assert "fell back" in json.loads(response.text)["decoding"]


def test_errors_are_4xx_and_the_server_keeps_serving(server, material, tmp_path):
    _, clips, expected = material
    with pytest.raises(openai.BadRequestError, match="broken.wav.*cannot decode audio"):
        transcribe(server, not_audio(tmp_path))
    with pytest.raises(openai.BadRequestError, match="unknown field 'beam_size'"):
        transcribe(server, clips[0], extra_body={"beam_size": 5})
    with pytest.raises(openai.BadRequestError, match="English-only"):
        with open(clips[0], "rb") as handle:
            server.audio.translations.create(file=handle, model=MODEL)
    with pytest.raises(openai.NotFoundError, match="pass model='whisper-tiny.en'"):
        with open(clips[0], "rb") as handle:
            server.audio.transcriptions.create(file=handle, model="gpt-4o-transcribe")
    big = tmp_path / "big.wav"
    big.write_bytes(b"\0" * (26 * 2**20))
    with pytest.raises(openai.APIStatusError, match="over this server's 25 MB") as raised:
        transcribe(server, big)
    assert raised.value.status_code == 413
    assert transcribe(server, clips[0]).text == expected[str(clips[0].resolve())]["text"]


def test_sixteen_concurrent_clients(server, material):
    _, clips, expected = material
    jobs = [clips[i % len(clips)] for i in range(16)]
    with ThreadPoolExecutor(16) as pool:
        texts = list(pool.map(lambda path: transcribe(server, path).text, jobs))
    assert texts == [expected[str(path.resolve())]["text"] for path in jobs]
    with urllib.request.urlopen(str(server.base_url).replace("/v1/", "/health"), timeout=30) as response:
        assert json.load(response) == {"status": "ok", "model": MODEL}
