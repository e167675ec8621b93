"""Atomic file writes for every command: a reader (or a rerun after a crash) sees the old file or the complete
new one, never part of one.

Each writer fills a temporary file in the target's own folder (so ``os.replace`` is a rename on one file
system), flushes it to disk, gives it the permissions ``open()`` gives under the current umask and renames it
over the target; on any failure, Ctrl-C included, the temporary file is removed and the target left as it was.
``staged_folder`` does the same for a whole folder.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shlex
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Callable


def command_line(program: str, argv: list[str] | None = None) -> str:
    """The command a run's output files record: ``python -m <program>`` (or ``python <script.py>``) and its
    arguments (``argv``, else this process's), quoted so that pasting it reruns the same run."""
    runner = ["python", program] if program.endswith(".py") else ["python", "-m", program]
    return shlex.join([*runner, *(sys.argv[1:] if argv is None else argv)])


TEMPORARY_NAME = re.compile(r"^\..+\.tmp-(\d+)-")  # write_atomic_with's: ".<name>.tmp-<pid>-..."


def remove_stale_temporaries(folder: str | os.PathLike) -> int:
    """Delete the temporary files that ``write_atomic_with`` left in ``folder`` in processes killed mid-write
    (kill -9, power loss): those whose process is gone. Returns how many."""
    stale = [path for path in Path(folder).glob(".*.tmp-*")
             if (match := TEMPORARY_NAME.match(path.name)) and path.is_file() and not _alive(int(match.group(1)))]
    for path in stale:
        path.unlink(missing_ok=True)
    return len(stale)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def write_atomic_with(path: str | os.PathLike, write: Callable[[str], None]) -> None:
    """Call ``write(temp_path)`` on a temporary file next to ``path``, then rename it over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # ".<name>.tmp-<pid>-...": hidden, and a killed run's leftover names its process (remove_stale_temporaries removes those)
    fd, temp_name = tempfile.mkstemp(prefix=f".{path.name}.tmp-{os.getpid()}-", dir=path.parent)
    os.close(fd)
    try:
        write(temp_name)
        apply_umask(temp_name)
        with open(temp_name, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(temp_name, path)
    except BaseException:
        Path(temp_name).unlink(missing_ok=True)
        raise


def write_atomic(path: str | os.PathLike, data: str | bytes) -> None:
    """``data`` (text is written as UTF-8) into ``path``, atomically."""
    content = data.encode("utf-8") if isinstance(data, str) else data
    write_atomic_with(path, lambda temp_name: Path(temp_name).write_bytes(content))


def write_json_atomic(path: str | os.PathLike, obj, *, indent: int | None = 2, ensure_ascii: bool = True,
                      sort_keys: bool = False) -> None:
    """``obj`` as JSON with a final newline, atomically. The options are ``json.dumps``'s: each caller keeps the
    formatting its committed files have."""
    write_atomic(path, json.dumps(obj, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys) + "\n")


def save_safetensors_atomic(path: str | os.PathLike, tensors: dict, metadata: dict | None = None) -> None:
    from safetensors.torch import save_file

    write_atomic_with(path, lambda temp_name: save_file(tensors, temp_name, metadata=metadata))


def torch_save_atomic(path: str | os.PathLike, obj) -> None:
    import torch

    write_atomic_with(path, lambda temp_name: torch.save(obj, temp_name))


def sha256_of(path: str | os.PathLike) -> str:
    """The SHA-256 of a file's bytes, read in chunks: memory stays flat whatever the file's size."""
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


@contextlib.contextmanager
def locked(path: str | os.PathLike):
    """Hold an exclusive lock (``flock``) on ``path``, created if missing, while the block runs; yields its
    descriptor, open for reading and appending. Processes locking the same file take turns; the lock goes with
    the descriptor, so a killed process never leaves it held."""
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield fd
    finally:
        os.close(fd)


def apply_umask(path) -> None:
    """Give ``path`` (a folder: and everything in it) the permissions open() and mkdir() give under the
    current umask, readable by others like any download: mkstemp, mkdtemp and safetensors' save_file
    make 0600/0700. (Nothing the commands write is meant to be executable.)"""
    umask = os.umask(0)
    os.umask(umask)
    if not os.path.isdir(path):
        os.chmod(path, 0o666 & ~umask)
        return
    for root, _, files in os.walk(path):
        os.chmod(root, 0o777 & ~umask)
        for name in files:
            if not os.path.islink(os.path.join(root, name)):
                os.chmod(os.path.join(root, name), 0o666 & ~umask)


@contextlib.contextmanager
def staged_folder(out: Path, suffix: str = "partial"):
    """A fresh sibling folder to write into; it replaces ``out`` only when the block ends without an error
    (an interrupted run leaves ``out`` as it was, and the staging folder is redone next time)."""
    staged = out.parent / f".{out.name}.{suffix}"
    shutil.rmtree(staged, ignore_errors=True)
    staged.mkdir(parents=True)
    yield staged
    apply_umask(staged)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(staged, out)


def replace_rows(rows: list[dict], new: list[dict], key) -> list[dict]:
    """``rows`` without those whose ``key(row)`` a ``new`` row has, then ``new``: a rerun's rows in a summary file
    replace its old ones and leave other runs' alone."""
    fresh = {key(row) for row in new}
    return [row for row in rows if key(row) not in fresh] + list(new)
