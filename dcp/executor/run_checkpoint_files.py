"""On-disk layout and commit protocol of run checkpoints (dcp.executor.run_checkpoint).

    <dir>/step-000000120/        a committed checkpoint: DCP's `.metadata` and `__<rank>_<i>.distcp`
                                 files, and `manifest.json` (every file's size and sha256)
    <dir>/.partial-step-000000130/   a save in progress (or one killed halfway): never read

Every rank writes its own shard files through DCP's FileSystemWriter into the partial directory
and hashes them as it writes; DCP then gathers every rank's write results on the coordinator,
which writes `.metadata`, collects the hashes into `manifest.json` (fsynced) and renames the
directory to its final name: one `rename(2)`, atomic on POSIX, so a reader sees either nothing
or the whole checkpoint. A save killed at any point before the rename leaves only a
`.partial-*` directory, which `committed_steps` ignores, and the last committed checkpoint stays
what it was. The coordinator commits inside DCP's `finish`, so an async save commits from the
background thread the moment its last byte is down, without a collective from training code.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

MANIFEST = "manifest.json"
"""Written last into a checkpoint directory, before its rename: the list of its files."""
METADATA = ".metadata"
"""DCP's own index of the checkpoint (tensor keys, shapes, chunks, where each is stored)."""
FORMAT = 1
"""Version of the layout and of the manifest's fields."""
_STEP_DIR = re.compile(r"^step-(\d+)$")
_PARTIAL_DIR = re.compile(r"^\.partial-step-(\d+)$")
_HASH_SUFFIX = ".sha256"
_CHUNK_BYTES = 1 << 22


def step_dir(root: Path, step: int) -> Path:
    """Where the committed checkpoint of `step` lives."""
    return root / f"step-{step:09d}"


def partial_dir(root: Path, step: int) -> Path:
    """Where the save of `step` is written until its commit."""
    return root / f".partial-step-{step:09d}"


def committed_steps(root: Path) -> list[int]:
    """Steps with a committed checkpoint under `root`, ascending (a directory without its
    manifest, made by hand or half-deleted, does not count)."""
    if not root.is_dir():
        return []
    steps = [int(m.group(1)) for p in root.iterdir() if (m := _STEP_DIR.match(p.name)) and (p / MANIFEST).is_file()]
    return sorted(steps)


def partial_steps(root: Path) -> list[int]:
    """Steps whose save started but never committed (killed halfway, or still being written)."""
    if not root.is_dir():
        return []
    return sorted(int(m.group(1)) for p in root.iterdir() if (m := _PARTIAL_DIR.match(p.name)))


def file_digest(path: Path) -> tuple[int, str]:
    """(bytes, sha256 hex) of a file, read in 4 MiB chunks."""
    h, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK_BYTES):
            h.update(chunk)
            size += len(chunk)
    return size, h.hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json_durably(path: Path, doc: dict[str, Any]) -> None:
    """Write `doc` to `path` through a temporary name, fsynced, then renamed."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class CommittingWriter(FileSystemWriter):
    """DCP's FileSystemWriter into a partial directory that the coordinator commits.

    `write_data` (every rank) hashes the files the rank just wrote into `<file>.sha256` beside
    them; `finish` (the coordinator, after every rank's writes) writes `.metadata`, folds the
    hashes into the manifest with `manifest_fields`, renames the directory to `final` and prunes
    committed checkpoints beyond the newest `keep`."""

    def __init__(self, partial: Path, final: Path, *, manifest_fields: dict[str, Any], keep: int | None,
                 thread_count: int = 1) -> None:
        super().__init__(partial, single_file_per_rank=True, sync_files=True, thread_count=thread_count,
                         overwrite=True)
        self.partial, self.final = Path(partial), Path(final)
        self.manifest_fields, self.keep = manifest_fields, keep
        self.bytes_written = 0
        """Bytes of shard files this rank wrote (set by write_data)."""

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        future = super().write_data(plan, planner)  # FileSystemWriter's future is already done
        names = sorted({r.storage_data.relative_path for r in future.wait()})
        self.bytes_written = 0
        for name in names:
            size, sha = file_digest(self.partial / name)
            self.bytes_written += size
            (self.partial / (name + _HASH_SUFFIX)).write_text(f"{size} {sha}\n")
        return future

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        super().finish(metadata, results)
        files: dict[str, dict[str, Any]] = {}
        for name in sorted({r.storage_data.relative_path for rank_results in results for r in rank_results}):
            size, sha = (self.partial / (name + _HASH_SUFFIX)).read_text().split()
            files[name] = {"bytes": int(size), "sha256": sha}
            (self.partial / (name + _HASH_SUFFIX)).unlink()
        size, sha = file_digest(self.partial / METADATA)
        files[METADATA] = {"bytes": size, "sha256": sha}
        write_json_durably(self.partial / MANIFEST, {"format": FORMAT, **self.manifest_fields, "files": files})
        _fsync_dir(self.partial)
        if self.final.exists():  # a committed save of the same step (a rerun): replaced whole
            shutil.rmtree(self.final)
        os.rename(self.partial, self.final)
        _fsync_dir(self.final.parent)
        if self.keep is not None:
            prune(self.final.parent, self.keep)


def prune(root: Path, keep: int) -> None:
    """Delete committed checkpoints beyond the newest `keep` (oldest first: the directory is
    renamed out of view before its files go, so a crash mid-delete leaves no half checkpoint)."""
    for step in committed_steps(root)[:-keep]:
        doomed = root / f".deleting-step-{step:09d}"
        os.rename(step_dir(root, step), doomed)
        shutil.rmtree(doomed, ignore_errors=True)


def read_manifest(path: Path) -> dict[str, Any]:
    """A committed checkpoint's manifest; ValueError naming the path when unreadable."""
    try:
        doc = json.loads((path / MANIFEST).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: unreadable {MANIFEST} ({e})") from e
    if doc.get("format") != FORMAT:
        raise ValueError(f"{path}: checkpoint format {doc.get('format')!r}, this dcp reads {FORMAT}")
    return doc


def verify_files(path: Path, manifest: dict[str, Any], names: Sequence[str], *, hashes: bool = True) -> list[str]:
    """Problems with `names` (files listed in the manifest) in the checkpoint at `path`: missing,
    of another size, or (with `hashes`) another sha256. Empty when all are intact."""
    problems = []
    for name in names:
        want = manifest["files"][name]
        f = path / name
        if not f.is_file():
            problems.append(f"{name} is missing")
            continue
        size = f.stat().st_size
        if size != want["bytes"]:
            problems.append(f"{name} has {size} bytes, the save wrote {want['bytes']}")
        elif hashes and file_digest(f)[1] != want["sha256"]:
            problems.append(f"{name} is corrupted (sha256 differs from the save's)")
    return problems
