"""tensorflow-datasets builders for the course's datasets, and a bridge to PyTorch.

TensorFlow is not needed: the builders write ``array_record`` files, and
``tfds.data_source`` reads them back with random access (``len(src)``, ``src[i]``), which
is all a ``torch.utils.data.DataLoader`` needs::

    src = tfds_source("chatbot_data", "train")     # prepared on first use, then reused
    loader = torch_loader(src, batch_size=32, shuffle=True)

Each builder reads its files through :func:`lib.data.path` (mirror, cache; never the
network directly) and is prepared once into ``COURSE_TFDS_DIR`` (default
``<COURSE_DATA_CACHE>/tfds``). Defining the builder classes registers them with tfds under
the name ``course_<dataset>`` (e.g. ``course_chatbot_data``), so that ``tfds.builder`` and
``tfds.data_source`` find them, without clashing with tfds's own catalogue.

Splits:

- imdb: the official ``train`` / ``test`` (25,000 each).
- chatbot_data, tatoeba_kor_eng, tatoeba_fra_eng: ``train`` / ``validation`` / ``test`` =
  80 / 10 / 10 % of the rows, drawn by ``random.Random(SPLIT_SEED).shuffle`` over the row
  indices (see :func:`split_indices`); within a split, rows keep the file's order.
- tinyshakespeare: nanoGPT's split by characters, the first 90 % ``train`` and the rest
  ``validation``, stored as consecutive chunks of ``CHUNK_CHARS`` characters, so that
  ``"".join(row["text"] for row in src)`` gives the split's text back exactly.
- nsmc_raw: one ``train`` split with the whole crawl (preparing it takes minutes).

Rows come back in the order they were written (tfds's shuffling is disabled); shuffle in
the DataLoader.
"""
from __future__ import annotations

import abc
import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

import numpy as np
import tensorflow_datasets as tfds
import torch
from torch.utils.data import DataLoader

from .files import cache_dir
from .loaders import load_chatbot, load_imdb, load_nsmc_raw, load_tatoeba, load_tinyshakespeare
from .registry import REGISTRY
from lib.validate import check_int

__all__ = ["TFDS_ENV", "SPLIT_SEED", "CHUNK_CHARS", "BUILDERS", "tfds_dir", "split_indices",
           "builder", "tfds_source", "DecodedSource", "torch_loader"]

TFDS_ENV = "COURSE_TFDS_DIR"
SPLIT_SEED = 0
CHUNK_CHARS = 1024
FILE_FORMAT = "array_record"


def tfds_dir() -> Path:
    """Where prepared datasets live: ``COURSE_TFDS_DIR``, default ``<cache>/tfds``."""
    value = os.environ.get(TFDS_ENV, "").strip()
    return Path(value).expanduser() if value else cache_dir() / "tfds"


def split_indices(n: int, seed: int = SPLIT_SEED) -> dict[str, list[int]]:
    """Row indices of a deterministic 80/10/10 train/validation/test split of ``n`` rows.

    The indices are shuffled with ``random.Random(seed)`` and cut; each split's indices
    are then sorted, so rows keep their file order within a split.
    """
    check_int("n", n, 0)
    order = list(range(n))
    random.Random(seed).shuffle(order)
    n_train, n_val = int(n * 0.8), int(n * 0.1)
    return {"train": sorted(order[:n_train]),
            "validation": sorted(order[n_train:n_train + n_val]),
            "test": sorted(order[n_train + n_val:])}


class _CourseBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """What every course builder shares: metadata from ``REGISTRY``, rows from the loaders.

    A subclass sets ``DATASET`` (the registry name) and writes ``_features()`` and
    ``_splits()`` (split name -> list of rows, each a dict matching the features).
    """

    # A prepared dataset is reused as long as its version folder exists: bump VERSION
    # whenever a builder, or a checksum in the registry, changes.
    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "First release, built from the course's checksummed files."}
    DATASET: str

    @abc.abstractmethod
    def _features(self) -> tfds.features.FeaturesDict:
        """The features of one row."""

    @abc.abstractmethod
    def _splits(self) -> dict[str, list[dict]]:
        """Split name -> its rows."""

    def _info(self) -> tfds.core.DatasetInfo:
        info = REGISTRY[self.DATASET]
        return tfds.core.DatasetInfo(
            builder=self,
            description=f"{info.description}\n\nLicense: {info.license}",
            features=self._features(),
            homepage=info.homepage,
            citation=info.citation,
            license=info.license,
            disable_shuffling=True,
        )

    def _split_generators(self, dl_manager):
        # The files come from lib.data.path (checksummed), not from tfds's download manager.
        return {split: self._generate_examples(rows) for split, rows in self._splits().items()}

    def _generate_examples(self, rows):
        for index, row in enumerate(rows):
            yield index, row


def _random_splits(rows: list[dict]) -> dict[str, list[dict]]:
    return {split: [rows[i] for i in indices]
            for split, indices in split_indices(len(rows)).items()}


class ChatbotData(_CourseBuilder):
    """Korean chatbot Q&A pairs with their topic label."""

    name = "course_chatbot_data"
    DATASET = "chatbot_data"

    def _features(self):
        return tfds.features.FeaturesDict({
            "q": tfds.features.Text(),
            "a": tfds.features.Text(),
            "label": tfds.features.ClassLabel(names=["everyday", "breakup", "love"]),
        })

    def _splits(self):
        return _random_splits(load_chatbot())


class Imdb(_CourseBuilder):
    """IMDB movie reviews, positive or negative, with the reviewer's rating."""

    name = "course_imdb"
    DATASET = "imdb"

    def _features(self):
        return tfds.features.FeaturesDict({
            "text": tfds.features.Text(),
            "label": tfds.features.ClassLabel(names=["neg", "pos"]),
            "rating": tfds.features.Scalar(dtype=np.int32),
        })

    def _splits(self):
        return {split: load_imdb(split) for split in ("train", "test")}


class _Tatoeba(_CourseBuilder, skip_registration=True):
    PAIR: str

    def _features(self):
        return tfds.features.FeaturesDict({
            "en": tfds.features.Text(),
            "other": tfds.features.Text(),
            "attribution": tfds.features.Text(),
        })

    def _splits(self):
        return _random_splits(load_tatoeba(self.PAIR))


class TatoebaKorEng(_Tatoeba):
    """English-Korean sentence pairs."""

    name = "course_tatoeba_kor_eng"
    DATASET = "tatoeba_kor_eng"
    PAIR = "kor_eng"


class TatoebaFraEng(_Tatoeba):
    """English-French sentence pairs."""

    name = "course_tatoeba_fra_eng"
    DATASET = "tatoeba_fra_eng"
    PAIR = "fra_eng"


class Tinyshakespeare(_CourseBuilder):
    """Tiny Shakespeare, split 90/10 by characters as nanoGPT does, in fixed-size chunks."""

    name = "course_tinyshakespeare"
    DATASET = "tinyshakespeare"

    def _features(self):
        return tfds.features.FeaturesDict({"text": tfds.features.Text()})

    def _splits(self):
        text = load_tinyshakespeare()
        n_train = int(len(text) * 0.9)
        parts = {"train": text[:n_train], "validation": text[n_train:]}
        return {split: [{"text": part[i:i + CHUNK_CHARS]} for i in range(0, len(part), CHUNK_CHARS)]
                for split, part in parts.items()}


class NsmcRaw(_CourseBuilder):
    """The raw NSMC crawl of Korean movie reviews (one split)."""

    name = "course_nsmc_raw"
    DATASET = "nsmc_raw"

    def _features(self):
        return tfds.features.FeaturesDict({
            "review_id": tfds.features.Scalar(dtype=np.int64),
            "movie_id": tfds.features.Scalar(dtype=np.int64),
            "rating": tfds.features.Scalar(dtype=np.int32),
            "date": tfds.features.Text(),
            "review": tfds.features.Text(),
        })

    def _splits(self):
        return {"train": load_nsmc_raw()}


BUILDERS: dict[str, type[_CourseBuilder]] = {
    cls.DATASET: cls for cls in (ChatbotData, Imdb, TatoebaKorEng, TatoebaFraEng, Tinyshakespeare, NsmcRaw)
}
"""The builder class of each dataset, by registry name."""


def builder(name: str) -> _CourseBuilder:
    """The (unprepared) tfds builder of dataset ``name``, writing into :func:`tfds_dir`."""
    if name not in BUILDERS:
        raise ValueError(f"unknown dataset name {name!r}: expected one of {', '.join(sorted(BUILDERS))}")
    return BUILDERS[name](data_dir=str(tfds_dir()), file_format=FILE_FORMAT)


def _plain(value: Any) -> Any:
    """tfds value -> plain Python: bytes -> str, numpy scalar -> int/float."""
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, np.generic):
        return value.item()
    return value


def _plain_row(row: dict) -> dict:
    return {key: _plain(value) for key, value in row.items()}


class DecodedSource:
    """A tfds data source whose rows are plain Python dicts (``str`` text, ``int`` labels).

    ``len(src)``, ``src[i]`` and iteration work as on a list. ``.source`` is the raw tfds
    data source (bytes and numpy scalars) and ``.info`` the dataset's ``tfds`` info.
    """

    def __init__(self, source, info: tfds.core.DatasetInfo):
        self.source = source
        self.info = info

    def __len__(self) -> int:
        return len(self.source)

    def _index(self, index: int) -> int:
        if not -len(self) <= index < len(self):
            raise IndexError(f"index {index} out of range for a source of {len(self)} rows")
        return index % len(self)

    def __getitem__(self, index: int) -> dict:
        return _plain_row(self.source[self._index(index)])

    def __getitems__(self, indices: list[int]) -> list[dict]:
        """Several rows in one read (a DataLoader asks for a whole batch this way)."""
        rows = self.source.__getitems__([self._index(i) for i in indices])
        return [_plain_row(row) for row in rows]

    def __iter__(self) -> Iterator[dict]:
        return (self[i] for i in range(len(self)))

    def __repr__(self) -> str:
        return f"DecodedSource({self.info.name}, {len(self)} rows)"


def tfds_source(name: str, split: str) -> DecodedSource:
    """Random-access rows of ``split`` of dataset ``name``, via ``tfds.data_source``.

    The dataset is prepared (written as array_record under :func:`tfds_dir`) the first
    time it is asked for, and reused afterwards.
    """
    prepared = builder(name)
    prepared.download_and_prepare()
    if split not in prepared.info.splits:
        raise ValueError(f"dataset {name!r} has splits {sorted(prepared.info.splits)}, got {split!r}")
    source = tfds.data_source(prepared.name, split=split, data_dir=str(tfds_dir()),
                              builder_kwargs={"file_format": FILE_FORMAT})
    return DecodedSource(source, prepared.info)


def torch_loader(source, batch_size: int, shuffle: bool = False,
                 collate_fn: Callable | None = None, seed: int = 0, num_workers: int = 0) -> DataLoader:
    """A DataLoader over a data source or any list of rows.

    ``shuffle`` draws a new order every epoch from a generator seeded with ``seed``, so
    two loaders built alike yield the same batches. Without ``collate_fn``, PyTorch's
    default collation turns a batch of dicts into a dict of lists (text) and tensors
    (numbers).
    """
    if not hasattr(source, "__len__") or not hasattr(source, "__getitem__"):
        raise TypeError(f"source must support len() and indexing (a list or a data source), "
                        f"got {type(source).__name__}")
    check_int("batch_size", batch_size, 1)
    generator = torch.Generator().manual_seed(seed)
    return DataLoader(source, batch_size=batch_size, shuffle=shuffle, collate_fn=collate_fn,
                      generator=generator, num_workers=num_workers)
