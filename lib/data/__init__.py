"""Real datasets: a registry, checked file lookup, loaders, and tensorflow-datasets builders.

::

    from lib import data
    rows = data.load_chatbot()                 # list of {"q", "a", "label"}
    text = data.load_tinyshakespeare()         # one str
    data.path("imdb", "imdb_train.csv.gz")     # mirror -> cache -> download, sha256 checked
    src = data.tfds_source("chatbot_data", "train")   # random access (array_record)
    loader = data.torch_loader(src, batch_size=32, shuffle=True)

See ``registry`` (what the datasets are), ``files`` (where they are found), ``loaders``
(plain Python) and ``builders`` (tensorflow-datasets, without TensorFlow). ``builders``
imports tensorflow-datasets and torch, which takes a few seconds, so it is only loaded
when one of its names is first used.
"""
from .registry import REGISTRY, DatasetInfo, FileInfo
from .files import CACHE_ENV, MIRROR_ENV, DataError, cache_dir, download, mirror_dir, path
from .loaders import load_chatbot, load_imdb, load_imdb_unsup, load_nsmc_raw, load_tatoeba, load_tinyshakespeare
from . import chatbot, noising  # chapter 4's chatbot split; BART's corruptions
from . import nsmc  # the course's balanced NSMC sentiment split (not the published NSMC split)
from .windows import random_windows  # a language model's training windows of one long text

_FROM_BUILDERS = ("tfds_source", "torch_loader", "split_indices", "builder", "tfds_dir", "BUILDERS",
                  "TFDS_ENV", "SPLIT_SEED", "CHUNK_CHARS")

__all__ = ["REGISTRY", "DatasetInfo", "FileInfo", "DataError", "MIRROR_ENV", "CACHE_ENV",
           "mirror_dir", "cache_dir", "download", "path", "load_chatbot", "load_imdb",
           "load_imdb_unsup", "load_tatoeba", "load_tinyshakespeare", "load_nsmc_raw", "chatbot", "noising", "nsmc",
           "random_windows",
           *_FROM_BUILDERS]


def __getattr__(name: str):
    """Load ``builders`` on first use of one of its names (PEP 562)."""
    if name in _FROM_BUILDERS:
        from . import builders

        return getattr(builders, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
