"""lib.io: atomic writes and checksums."""
from __future__ import annotations

import hashlib
import os
import stat

import pytest

from lib.io import atomic_write, sha256


def test_atomic_write_replaces_the_file_only_on_success(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_write(target, "w") as f:
            f.write("half")
            raise RuntimeError("crash while writing")
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]   # no temporary file left
    with atomic_write(target, "w") as f:
        f.write("new")
    assert target.read_text() == "new"


def test_atomic_write_gives_the_usual_permissions(tmp_path):
    umask = os.umask(0o022)
    try:
        with atomic_write(tmp_path / "a.bin") as f:
            f.write(b"x")
    finally:
        os.umask(umask)
    assert stat.S_IMODE((tmp_path / "a.bin").stat().st_mode) == 0o644


def test_atomic_write_rejects_other_modes(tmp_path):
    with pytest.raises(ValueError, match="modes"):
        with atomic_write(tmp_path / "x", "a"):
            pass


def test_sha256_matches_hashlib(tmp_path):
    data = os.urandom(3_000_000)
    (tmp_path / "blob").write_bytes(data)
    assert sha256(tmp_path / "blob") == hashlib.sha256(data).hexdigest()


def test_folder_from_env_serves_the_data_and_checkpoint_mirrors(tmp_path, monkeypatch):
    import pytest

    from lib import checkpoints
    from lib.data import files
    from lib.io import folder_from_env
    monkeypatch.delenv("SOME_FOLDER", raising=False)
    assert folder_from_env("SOME_FOLDER", ValueError, "") is None
    monkeypatch.setenv("SOME_FOLDER", str(tmp_path))
    assert folder_from_env("SOME_FOLDER", ValueError, "") == tmp_path
    missing = str(tmp_path / "nowhere")
    monkeypatch.setenv(files.MIRROR_ENV, missing)
    with pytest.raises(files.DataError, match=r"is not a folder\. Point it at the course's shared data folder"):
        files.mirror_dir()
    monkeypatch.setenv(checkpoints.MIRROR_ENV, missing)
    with pytest.raises(checkpoints.CheckpointError, match="is not a folder: point it at a copy of checkpoints/"):
        checkpoints._mirror()
