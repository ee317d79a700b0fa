"""What the course's datasets are: files, checksums, upstream URLs, licenses and citations.

Every file the course reads is listed here with its sha256, so that a file found in the
mirror, in the cache or fresh from the network is checked before anyone reads it. The
numbers come from each dataset's ``SHA256SUMS`` in the shared data folder, and the
provenance from its ``SOURCE.md``.

Some files have a direct upstream URL (``FileInfo.direct`` is True) and are downloaded when
missing. Others were re-packaged from an archive (the IMDB CSVs, the French Tatoeba pairs,
the NSMC crawl): for those ``url`` points at the upstream archive they came from and
``DatasetInfo.how_to_get`` says how to obtain the file.
"""
from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["FileInfo", "DatasetInfo", "REGISTRY"]

MIRROR_HINT = "set COURSE_DATA_MIRROR to the course's shared data folder (e.g. ../shared/data)"


@dataclass(frozen=True)
class FileInfo:
    """One file of a dataset.

    url: where the file (or, if ``direct`` is False, the archive it was made from) lives.
    sha256: hex digest of the exact bytes the course reads.
    size: size in bytes, used as the progress-bar total when the server sends none.
    direct: True if ``url`` serves this very file, so that it can be downloaded as is.
    """

    url: str
    sha256: str
    size: int | None = None
    direct: bool = True


@dataclass(frozen=True)
class DatasetInfo:
    """A dataset: where it comes from, under which terms, and which files it has."""

    name: str
    description: str
    homepage: str
    license: str
    citation: str
    files: dict[str, FileInfo] = field(default_factory=dict)
    how_to_get: str = ""


_CHATBOT_RAW = "https://raw.githubusercontent.com/songys/Chatbot_data/4cf20d13fc46f5037fd1c531cd566e2dd9f72974"
_KOR_RAW = ("https://raw.githubusercontent.com/r0cd7b/nlp_with_rnns_and_attention/"
            "875d03899a2c217633fa28e8917a8b26382c5269/kor-eng")
_FRA_ZIP = ("https://raw.githubusercontent.com/genimind/seq2seq/"
            "4f3f8eb0adde54fcc8b89394336b002e7961244c/fra-eng.zip")
_IMDB_TAR = "https://ai.stanford.edu/~amaas/data/sentiment/aclImdb_v1.tar.gz"
_NSMC_RAW = "https://raw.githubusercontent.com/e9t/nsmc/cc0670e872d4ac27bfe36c87456783004b39ef6c"
_NSMC_TREE = "https://github.com/e9t/nsmc/tree/cc0670e872d4ac27bfe36c87456783004b39ef6c/raw"
_CHAR_RNN = ("https://raw.githubusercontent.com/karpathy/char-rnn/"
             "6f9487a6fe5b420b7ca9afb0d7c078e37c1d1b4e/data/tinyshakespeare/input.txt")

_TATOEBA_CITATION = """\
@misc{tatoeba,
  author = {{Tatoeba Project} and {ManyThings.org}},
  title = {Tatoeba bilingual sentence pairs (Anki export)},
  howpublished = {https://tatoeba.org, http://www.manythings.org/anki/},
  note = {CC-BY 2.0 (France). Attribution: www.manythings.org/anki and tatoeba.org}
}"""

_DATASETS = [
    DatasetInfo(
        name="chatbot_data",
        description=(
            "Korean chatbot Q&A pairs (Chatbot_data_for_Korean v1.0): 11,823 synthetic question/"
            "answer pairs labelled 0 = everyday talk, 1 = breakup (negative), 2 = love (positive)."),
        homepage="https://github.com/songys/Chatbot_data",
        license="MIT",
        citation="""\
@misc{song2018chatbot,
  author = {Youngsook Song},
  title = {Chatbot_data_for_Korean v1.0},
  year = {2018},
  howpublished = {https://github.com/songys/Chatbot_data}
}""",
        files={
            "ChatbotData.csv": FileInfo(
                f"{_CHATBOT_RAW}/ChatbotData.csv",
                "287eb129695b577321c80ad397bb3c2279164d4ca577874d129fd3db5b30afe2", 889842),
            "LICENSE": FileInfo(
                f"{_CHATBOT_RAW}/LICENSE",
                "1d8084ef9ea897ec462ce6c0e538f97967894699aac65c933804062714d3330a", 1068),
        },
        how_to_get="Both files download directly from GitHub (pinned commit 4cf20d1).",
    ),
    DatasetInfo(
        name="imdb",
        description=(
            "IMDB Large Movie Review Dataset v1.0: 25,000 train and 25,000 test English movie "
            "reviews, each 12,500 negative (rating 1-4) and 12,500 positive (rating 7-10)."),
        homepage="https://ai.stanford.edu/~amaas/data/sentiment/",
        license=("No formal license: IMDb user reviews distributed by Stanford for research; "
                 "cite Maas et al. (2011). Fine for teaching, do not relicense."),
        citation="""\
@inproceedings{maas2011imdb,
  author = {Andrew L. Maas and Raymond E. Daly and Peter T. Pham and Dan Huang and
            Andrew Y. Ng and Christopher Potts},
  title = {Learning Word Vectors for Sentiment Analysis},
  booktitle = {Proceedings of the 49th Annual Meeting of the Association for
               Computational Linguistics: Human Language Technologies},
  pages = {142--150},
  year = {2011},
  url = {http://www.aclweb.org/anthology/P11-1015}
}""",
        files={
            "imdb_train.csv.gz": FileInfo(
                _IMDB_TAR, "23f1d63befbe19362d62f344cec132b299df9806365e12e318fa6a9988627dfd",
                13024818, direct=False),
            "imdb_test.csv.gz": FileInfo(
                _IMDB_TAR, "bc9c93dda0b3ff1679e2a9e0a5214e2e4def14f97863312c5ef0fdaf3d8efb67",
                12721099, direct=False),
            "aclImdb_README.txt": FileInfo(
                _IMDB_TAR, "a69bd3b91235c7fa1d6aadab51e257b7fa3f7b68f32b607483a72bd67f95e557",
                4037, direct=False),
        },
        how_to_get=(
            f"{MIRROR_HINT}. The CSVs re-package aclImdb/{{train,test}}/{{pos,neg}}/<id>_<rating>.txt "
            f"from {_IMDB_TAR} (columns file,id,rating,label,text; gzip -9 -n); "
            "aclImdb_README.txt is the archive's aclImdb/README. See shared/data/imdb/SOURCE.md."),
    ),
    DatasetInfo(
        name="imdb_unsup",
        description=(
            "IMDB's 50,000 unlabelled reviews (aclImdb/train/unsup), for language-model pre-training "
            "only: the README does not say their movies are disjoint from the test set's, so never "
            "evaluate on them."),
        homepage="https://ai.stanford.edu/~amaas/data/sentiment/",
        license=("No formal license: IMDb user reviews distributed by Stanford for research; "
                 "cite Maas et al. (2011). Fine for teaching, do not relicense."),
        citation="Maas et al. (2011), as for the dataset 'imdb'.",
        files={
            "imdb_unsup.csv.gz": FileInfo(
                _IMDB_TAR, "d47b18f1739f3daa1b8ba1c3fa2e2bb0562bd22106be0bcbf9ff00797251b4da",
                26040933, direct=False),
        },
        how_to_get=(
            f"{MIRROR_HINT}. The CSV re-packages aclImdb/train/unsup/<id>_0.txt from {_IMDB_TAR} "
            "(columns file,id,text; gzip -9 -n). See shared/data/imdb_unsup/SOURCE.md."),
    ),
    DatasetInfo(
        name="nsmc_raw",
        description=(
            "The raw Naver movie review crawl (712,404 Korean reviews, ratings 1-10) that the Naver "
            "Sentiment Movie Corpus v1.0 was sampled from. Not the canonical 150k/50k NSMC split."),
        homepage="https://github.com/e9t/nsmc",
        license="CC0 1.0",
        citation="""\
@misc{park2016nsmc,
  author = {Lucy Park},
  title = {Naver Sentiment Movie Corpus v1.0},
  year = {2016},
  howpublished = {https://github.com/e9t/nsmc}
}""",
        files={
            "nsmc_raw_reviews.csv.gz": FileInfo(
                _NSMC_TREE, "3675f6fba195e9a85b8932d0bd3ff8b9244f37d58a48f1ce785572ed91aec978",
                32009746, direct=False),
            "nsmc_README.orig.md": FileInfo(
                f"{_NSMC_RAW}/README.md",
                "17b440d9acf9d528641aeb271ac3e8aa68b8b14e9a177cbbe8c9ace82032f2ed", 2596),
        },
        how_to_get=(
            f"{MIRROR_HINT}. nsmc_raw_reviews.csv.gz merges the 14,730 files raw/*.json of "
            "github.com/e9t/nsmc (commit cc0670e) into one CSV (review_id,movie_id,rating,date,"
            "review; sorted by review_id; gzip -9 -n). See shared/data/nsmc_raw/SOURCE.md."),
    ),
    DatasetInfo(
        name="tatoeba_kor_eng",
        description=("5,749 English-Korean sentence pairs from Tatoeba (ManyThings.org Anki export, "
                     "2023-02-20 release), each with its per-sentence attribution."),
        homepage="http://www.manythings.org/anki/",
        license="CC-BY 2.0 (France)",
        citation=_TATOEBA_CITATION,
        files={
            "kor.txt": FileInfo(
                f"{_KOR_RAW}/kor.txt",
                "6c9d8de3e500306997e4083274fb0038ef521651ffb2b7923e4e607a59d09dbc", 843519),
            "_about.txt": FileInfo(
                f"{_KOR_RAW}/_about.txt",
                "14edaa774978b74d57a316ed402880c69af8de5c0087e6705b9eb5557621c65e", 1441),
        },
        how_to_get="Both files download directly from GitHub (pinned commit 875d038).",
    ),
    DatasetInfo(
        name="tatoeba_fra_eng",
        description=("142,787 English-French sentence pairs from Tatoeba (ManyThings.org Anki "
                     "export, 2017-09-29 release)."),
        homepage="http://www.manythings.org/anki/",
        license="CC-BY 2.0 (France)",
        citation=_TATOEBA_CITATION,
        files={
            "fra.txt.gz": FileInfo(
                _FRA_ZIP, "ec59d6aaba2103a1320330f39bec51dbebbb20cb6bbe9976bd16b0622c965a50",
                2941514, direct=False),
            "_about.txt": FileInfo(
                _FRA_ZIP, "359011f5738272138286287b44db215d184823911eb049da2160a6ac6933d6c9",
                1441, direct=False),
        },
        how_to_get=(
            f"{MIRROR_HINT}, or download {_FRA_ZIP}, extract fra.txt and _about.txt, and "
            "compress fra.txt with `gzip -9 -n` (gzip 1.12 gives the exact bytes)."),
    ),
    DatasetInfo(
        name="tinyshakespeare",
        description=("Tiny Shakespeare (char-rnn): 1,115,394 characters (40,000 lines) of "
                     "Shakespeare's plays, the corpus of nanoGPT's character-level example."),
        homepage="https://github.com/karpathy/char-rnn",
        license="Public domain (Shakespeare's text)",
        citation="""\
@misc{karpathy2015charrnn,
  author = {Andrej Karpathy},
  title = {char-rnn},
  year = {2015},
  howpublished = {https://github.com/karpathy/char-rnn},
  note = {The Unreasonable Effectiveness of Recurrent Neural Networks,
          http://karpathy.github.io/2015/05/21/rnn-effectiveness/}
}""",
        files={
            "input.txt": FileInfo(
                _CHAR_RNN, "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed", 1115394),
        },
        how_to_get="input.txt downloads directly from GitHub (pinned commit 6f9487a).",
    ),
]

REGISTRY: dict[str, DatasetInfo] = {d.name: d for d in _DATASETS}
"""Every dataset the course uses, by name."""
