"""A Hub that never answers, or refuses the connection, costs one short timeout, not minutes of retries per file:
the command fails in one line saying what it looked for and how to work offline. (The only servers here listen on
127.0.0.1; HF_HUB_OFFLINE is unset only in the command run by each test.)"""

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT_S = 2  # HF_HUB_ETAG_TIMEOUT in the command


@pytest.fixture
def silent_endpoint():
    """http://127.0.0.1:PORT of a server that accepts every connection and never answers."""
    server = socket.create_server(("127.0.0.1", 0))
    held, stop = [], threading.Event()

    def accept():
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                pass

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join()
    for connection in held:
        connection.close()
    server.close()


@pytest.fixture
def refusing_endpoint():
    """http://127.0.0.1:PORT of a port nothing listens on (the connection is refused)."""
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def transcribe_online(endpoint: str, tmp_path) -> tuple[subprocess.CompletedProcess, float]:
    """``tools.transcribe`` of one clip with base ``openai/whisper-small.en`` (not in the empty caches), against
    ``endpoint`` as the Hub, HF_HUB_OFFLINE unset: (the process, its seconds)."""
    import soundfile as sf

    sf.write(tmp_path / "a.wav", np.zeros(1600, np.float32), 16000)
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update(HF_ENDPOINT=endpoint, HF_HUB_ETAG_TIMEOUT=str(TIMEOUT_S), HF_HOME=str(tmp_path / "hf"),
               MEDUSA_ASR_CACHE=str(tmp_path / "medusa"), NO_PROXY="127.0.0.1", no_proxy="127.0.0.1")
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "tools.transcribe", str(tmp_path / "a.wav"), "--model",
                           str(ROOT / "heads" / "whisper-tiny.en"), "--base", "openai/whisper-small.en", "--quiet"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    return done, time.perf_counter() - started


@pytest.mark.parametrize("endpoint", ["silent_endpoint", "refusing_endpoint"])
def test_an_unreachable_hub_fails_at_once_in_one_line(endpoint, request, tmp_path):
    done, seconds = transcribe_online(request.getfixturevalue(endpoint), tmp_path)
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 2, done.stderr
    assert len(errors) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "openai/whisper-small.en/config.json" in errors[0] and "HF_HUB_OFFLINE=1" in errors[0]
    assert "no answer from http://127.0.0.1" in errors[0]
    # one bounded request, whatever the process's start-up costs (imports: ~10 s on a busy 2-core machine)
    assert seconds < 60 + TIMEOUT_S, seconds
    assert f"timeout {TIMEOUT_S} s" in errors[0]
