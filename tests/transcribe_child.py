"""``python tests/transcribe_child.py MODE FOLDER ARGS...``: the transcription command in a process of its own, on
test_transcribe's fake model, for tests that need real processes (concurrent runs, signals).

MODE ``meet``: every generate waits until two processes have reached it (a file each in FOLDER), so that two runs
have both chosen their outputs before either writes one. MODE ``stall``: the second output write stops half-way,
says so (FOLDER/stalled) and sleeps, for a signal to arrive. MODE ``plain``: neither.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import test_transcribe  # noqa: E402
from tools import files, transcribe  # noqa: E402


class MeetingModel(test_transcribe.FakeModel):
    def __init__(self, folder: Path):
        super().__init__()
        self.folder = folder

    def generate(self, *args, **kwargs):
        (self.folder / f"arrived-{os.getpid()}").touch()
        deadline = time.monotonic() + 60
        while len(list(self.folder.glob("arrived-*"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        return super().generate(*args, **kwargs)


def stall_second_write(folder: Path) -> None:
    writes = []
    real = files.write_atomic

    def write_atomic(path, data):
        writes.append(path)
        if len(writes) != 2:
            return real(path, data)

        def half_then_sleep(temp_name):
            Path(temp_name).write_text(data[: len(data) // 2])
            (folder / "stalled").touch()
            time.sleep(60)

        files.write_atomic_with(path, half_then_sleep)

    transcribe.files.write_atomic = write_atomic


def main() -> int:
    mode, folder, argv = sys.argv[1], Path(sys.argv[2]), sys.argv[3:]
    model = MeetingModel(folder) if mode == "meet" else test_transcribe.FakeModel()
    if mode == "stall":
        stall_second_write(folder)
    return transcribe.main([*argv, "--quiet"], model_loader=lambda *args, **kwargs: model)


if __name__ == "__main__":
    sys.exit(main())
