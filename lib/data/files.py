"""Finding a dataset file: the mirror, then the cache, then the network.

``path("tinyshakespeare", "input.txt")`` returns a local path to a file whose sha256 has
been checked. It looks, in order, in

1. the mirror folder named by ``COURSE_DATA_MIRROR`` (layout ``<mirror>/<name>/<filename>``,
   as in the course's shared data folder),
2. the cache folder ``COURSE_DATA_CACHE`` (default ``~/.cache/attention-course``),
   same layout,
3. the upstream URL: the file is streamed into a temporary file in the cache folder and
   renamed to its final name only once its sha256 matches.

A file that is missing and cannot be downloaded, or whose checksum is wrong, raises
``DataError`` with the file, the expected (and actual) sha256, and how to get it.
"""
from __future__ import annotations

import hashlib
import os
import urllib.request
from pathlib import Path

from tqdm.auto import tqdm

from lib.io import atomic_write, folder_from_env, sha256 as file_sha256

from .registry import MIRROR_HINT, REGISTRY, DatasetInfo, FileInfo

__all__ = ["DataError", "MIRROR_ENV", "CACHE_ENV", "mirror_dir", "cache_dir", "dataset", "path",
           "download", "verify"]

MIRROR_ENV = "COURSE_DATA_MIRROR"
CACHE_ENV = "COURSE_DATA_CACHE"

# (path, mtime in ns, size) -> sha256 of a file already hashed in this process.
_hashed: dict[tuple[str, int, int], str] = {}


class DataError(RuntimeError):
    """A dataset file is missing, corrupt, or could not be downloaded."""


def mirror_dir() -> Path | None:
    """The mirror folder (``COURSE_DATA_MIRROR``), or None when the variable is unset."""
    return folder_from_env(MIRROR_ENV, DataError, ". Point it at the course's shared data folder "
                                                  "(e.g. ../shared/data) or unset it.")


def cache_dir() -> Path:
    """The download cache (``COURSE_DATA_CACHE``, default ``~/.cache/attention-course``)."""
    value = os.environ.get(CACHE_ENV, "").strip()
    return Path(value).expanduser() if value else Path.home() / ".cache" / "attention-course"


def dataset(name: str) -> DatasetInfo:
    """The registry entry of ``name``; ValueError naming the known datasets otherwise."""
    if not isinstance(name, str) or name not in REGISTRY:
        raise ValueError(f"unknown dataset name {name!r}: expected one of {', '.join(sorted(REGISTRY))}")
    return REGISTRY[name]


def _how_to_get(info: DatasetInfo, file: FileInfo, in_mirror: Path | None = None) -> str:
    """How to get ``file``. ``in_mirror``: where the file belongs when the mirror is already
    set, so that the advice says to copy it there instead of to set the variable again."""
    how = f"{MIRROR_HINT}, or let lib.data download it from {file.url} ({info.how_to_get})" \
        if file.direct else info.how_to_get
    if in_mirror is not None:
        how = how.replace(MIRROR_HINT, f"copy it to {in_mirror} ({MIRROR_ENV} is set to "
                                       f"{in_mirror.parent.parent}, which lacks it)")
    return how


def verify(file: Path, expected: str, how_to_get: str = "") -> Path:
    """Check that ``file`` has sha256 ``expected``; raise DataError naming both digests if not.

    Hashes are remembered per process by (path, mtime, size), so checking the same
    unchanged file again costs one ``stat``.
    """
    stat = file.stat()
    key = (str(file.resolve()), stat.st_mtime_ns, stat.st_size)
    if key not in _hashed:
        _hashed[key] = file_sha256(file)
    actual = _hashed[key]
    if actual != expected:
        raise DataError(f"{file} is corrupt: its sha256 is {actual}, expected {expected}. "
                        f"Replace it with a good copy: {how_to_get}")
    return file


def download(url: str, dest: Path, expected_sha256: str, size: int | None = None) -> Path:
    """Stream ``url`` into ``dest`` with a progress bar; keep it only if the sha256 matches.

    The bytes go to a temporary file beside ``dest`` that is renamed to ``dest`` after the
    checksum passes. On any failure (network, checksum) nothing is left behind. Any URL
    that ``urllib`` opens works, including ``file://`` URLs.
    """
    digest = hashlib.sha256()
    try:
        with urllib.request.urlopen(url, timeout=60) as response, atomic_write(dest) as out:
            total = int(response.headers.get("Content-Length") or 0) or size
            with tqdm(total=total, unit="B", unit_scale=True, desc=f"download {dest.name}") as bar:
                while block := response.read(1 << 16):
                    digest.update(block)
                    out.write(block)
                    bar.update(len(block))
            if digest.hexdigest() != expected_sha256:
                raise DataError(f"download of {url} is corrupt: its sha256 is {digest.hexdigest()}, "
                                f"expected {expected_sha256}; nothing was saved to {dest}")
    except OSError as err:  # urllib.error.URLError is an OSError too
        raise DataError(f"could not download {url} to {dest}: {err}") from err
    return dest


def path(name: str, filename: str | None = None) -> Path:
    """Local, checksum-verified path of ``filename`` of dataset ``name``.

    ``filename`` defaults to the dataset's main file (the first one in its registry entry).
    Looks in the mirror, then the cache, then downloads into the cache (see the module doc).
    """
    info = dataset(name)
    if filename is None:
        filename = next(iter(info.files))
    if filename not in info.files:
        raise ValueError(f"dataset {name!r} has no file {filename!r}: expected one of "
                         f"{', '.join(info.files)}")
    file = info.files[filename]
    mirror = mirror_dir()
    how = _how_to_get(info, file, mirror / name / filename if mirror else None)
    candidates = ([mirror / name / filename] if mirror else []) + [cache_dir() / name / filename]
    for candidate in candidates:
        if candidate.is_file():
            return verify(candidate, file.sha256, how)

    if not file.direct:
        looked = ", ".join(str(c) for c in candidates)
        mirror_state = "" if mirror else f" ({MIRROR_ENV} is unset)"
        raise DataError(f"data file {name}/{filename} (sha256 {file.sha256}) was not found; "
                        f"looked in {looked}{mirror_state}. To get it: {how}")
    try:
        return download(file.url, candidates[-1], file.sha256, file.size)
    except DataError as err:
        # One message with everything, not two chained tracebacks.
        raise DataError(f"data file {name}/{filename} (sha256 {file.sha256}) is not available: "
                        f"{err}. To get it: {how}") from None
