"""Tests of lib.data: registry, file lookup (mirror, cache, download), loaders, tfds builders.

The lookup tests use a made-up dataset served from a ``file://`` URL, so they need no
network. The loader and builder tests read the real files from the data mirror (see
``conftest.py``) and check them against the numbers in each dataset's SOURCE.md.
"""
from __future__ import annotations

import hashlib
import os
import re
from collections import Counter
from types import SimpleNamespace

import pytest
import torch

from lib import data
from lib.data import files
from lib.data.registry import REGISTRY, DatasetInfo, FileInfo

DATASETS = {"chatbot_data", "imdb", "imdb_unsup", "nsmc_raw", "tatoeba_kor_eng", "tatoeba_fra_eng", "tinyshakespeare"}


# ---------------------------------------------------------------- registry
def test_registry_lists_every_dataset_with_provenance():
    assert set(REGISTRY) == DATASETS
    for name, info in REGISTRY.items():
        assert info.name == name
        for field in ("description", "homepage", "license", "citation", "how_to_get"):
            assert getattr(info, field).strip(), f"{name} has an empty {field}"
        assert info.homepage.startswith("http")
        for filename, file in info.files.items():
            assert re.fullmatch(r"[0-9a-f]{64}", file.sha256), f"{name}/{filename}"
            assert file.url.startswith("https://") or file.url.startswith("http://")


def test_files_with_a_direct_url_are_the_downloadable_ones():
    direct = {(name, f) for name, info in REGISTRY.items() for f, fi in info.files.items() if fi.direct}
    assert ("tinyshakespeare", "input.txt") in direct
    assert ("chatbot_data", "ChatbotData.csv") in direct
    assert ("tatoeba_kor_eng", "kor.txt") in direct
    # Re-packaged files exist upstream only inside an archive (or as many files).
    assert ("imdb", "imdb_train.csv.gz") not in direct
    assert ("tatoeba_fra_eng", "fra.txt.gz") not in direct
    assert ("nsmc_raw", "nsmc_raw_reviews.csv.gz") not in direct


def test_registry_checksums_match_the_mirror_sha256sums(data_mirror):
    for name, info in REGISTRY.items():
        listed = {}
        for line in (data_mirror / name / "SHA256SUMS").read_text().splitlines():
            digest, filename = line.split(maxsplit=1)
            listed[filename] = digest
        assert {f: fi.sha256 for f, fi in info.files.items()} == listed, name


def test_every_mirror_file_passes_path(data_mirror):
    for name, info in REGISTRY.items():
        for filename in info.files:
            found = data.path(name, filename)
            assert found == data_mirror / name / filename
    assert data.path("tinyshakespeare") == data_mirror / "tinyshakespeare" / "input.txt"


# ---------------------------------------------------------------- path(): mirror, cache, download
@pytest.fixture
def toy(tmp_path, monkeypatch):
    """A one-file dataset "toy" whose upstream is a file:// URL; mirror and cache start empty."""
    payload = "어텐션 is all you need\n".encode() * 200
    upstream = tmp_path / "upstream" / "toy.txt"
    upstream.parent.mkdir()
    upstream.write_bytes(payload)
    digest = hashlib.sha256(payload).hexdigest()
    info = DatasetInfo(name="toy", description="a test dataset", homepage="https://example.org",
                       license="CC0", citation="none",
                       files={"toy.txt": FileInfo(upstream.as_uri(), digest, len(payload))},
                       how_to_get="copy it from the test's upstream folder")
    monkeypatch.setitem(REGISTRY, "toy", info)
    mirror, cache = tmp_path / "mirror", tmp_path / "cache"
    mirror.mkdir()
    monkeypatch.setenv(files.MIRROR_ENV, str(mirror))
    monkeypatch.setenv(files.CACHE_ENV, str(cache))
    return SimpleNamespace(payload=payload, sha256=digest, upstream=upstream, mirror=mirror,
                           cache=cache, info=info)


def _put(folder, payload):
    (folder / "toy").mkdir(parents=True, exist_ok=True)
    (folder / "toy" / "toy.txt").write_bytes(payload)
    return folder / "toy" / "toy.txt"


def test_download_lands_in_the_cache_after_the_checksum(toy):
    found = data.path("toy", "toy.txt")
    assert found == toy.cache / "toy" / "toy.txt"
    assert found.read_bytes() == toy.payload
    assert os.listdir(toy.cache / "toy") == ["toy.txt"]  # no temporary file left
    toy.upstream.unlink()  # the second call must use the cache, not the network
    assert data.path("toy", "toy.txt") == found


def test_download_with_a_wrong_checksum_leaves_nothing(toy, monkeypatch):
    wrong = "0" * 64
    monkeypatch.setitem(REGISTRY, "toy", DatasetInfo(
        **{**vars(toy.info), "files": {"toy.txt": FileInfo(toy.upstream.as_uri(), wrong)}}))
    with pytest.raises(data.DataError) as err:
        data.path("toy", "toy.txt")
    message = str(err.value)
    assert wrong in message and toy.sha256 in message and "toy/toy.txt" in message
    assert not (toy.cache / "toy").exists() or os.listdir(toy.cache / "toy") == []


def test_failed_download_leaves_nothing_and_says_how_to_get_it(toy):
    toy.upstream.unlink()
    with pytest.raises(data.DataError) as err:
        data.path("toy", "toy.txt")
    message = str(err.value)
    assert "toy/toy.txt" in message and toy.sha256 in message and toy.upstream.as_uri() in message
    assert "COURSE_DATA_MIRROR" in message
    assert not (toy.cache / "toy").exists() or os.listdir(toy.cache / "toy") == []


def test_failed_download_with_the_mirror_set_says_where_the_file_belongs(toy):
    """The mirror is set but lacks the file: say so, and do not tell the reader to set it."""
    toy.upstream.unlink()
    with pytest.raises(data.DataError) as err:
        data.path("toy", "toy.txt")
    message = str(err.value)
    assert f"copy it to {toy.mirror / 'toy' / 'toy.txt'}" in message
    assert f"is set to {toy.mirror}" in message
    assert "set COURSE_DATA_MIRROR to" not in message
    # One traceback: the download error is in the message, not chained below it.
    assert err.value.__cause__ is None and err.value.__suppress_context__


def test_failed_download_without_a_mirror_says_to_set_it(toy, monkeypatch):
    monkeypatch.delenv(files.MIRROR_ENV)
    toy.upstream.unlink()
    with pytest.raises(data.DataError) as err:
        data.path("toy", "toy.txt")
    message = str(err.value)
    assert "set COURSE_DATA_MIRROR to" in message and "is set to" not in message


def test_missing_file_without_direct_url_names_file_checksum_and_remedy(toy, monkeypatch):
    monkeypatch.setitem(REGISTRY, "toy", DatasetInfo(**{**vars(toy.info), "files": {
        "toy.txt": FileInfo(toy.upstream.as_uri(), toy.sha256, direct=False)}}))
    with pytest.raises(data.DataError) as err:
        data.path("toy", "toy.txt")
    message = str(err.value)
    assert "toy/toy.txt" in message
    assert toy.sha256 in message
    assert "copy it from the test's upstream folder" in message
    assert str(toy.mirror / "toy" / "toy.txt") in message
    assert not (toy.cache / "toy").exists()  # it did not try to download the archive


def test_mirror_beats_cache(toy):
    in_cache = _put(toy.cache, toy.payload)
    in_mirror = _put(toy.mirror, toy.payload)
    assert data.path("toy", "toy.txt") == in_mirror
    in_mirror.unlink()
    assert data.path("toy", "toy.txt") == in_cache


def test_corrupt_file_is_rejected_with_both_checksums(toy):
    bad = _put(toy.mirror, toy.payload[:-1] + b"!")
    with pytest.raises(data.DataError) as err:
        data.path("toy", "toy.txt")
    message = str(err.value)
    assert str(bad) in message
    assert toy.sha256 in message and hashlib.sha256(bad.read_bytes()).hexdigest() in message


def test_verification_is_cached_until_the_file_changes(toy, monkeypatch):
    good = _put(toy.mirror, toy.payload)
    calls = []
    real_sha256 = files.file_sha256
    monkeypatch.setattr(files, "file_sha256", lambda p: calls.append(p) or real_sha256(p))
    for _ in range(3):
        assert data.path("toy", "toy.txt") == good
    assert len(calls) == 1
    good.write_bytes(toy.payload + b"tampered")
    with pytest.raises(data.DataError, match="corrupt"):
        data.path("toy", "toy.txt")
    assert len(calls) == 2


def test_mirror_variable_pointing_nowhere_is_an_error(toy, monkeypatch, tmp_path):
    monkeypatch.setenv(files.MIRROR_ENV, str(tmp_path / "no-such-folder"))
    with pytest.raises(data.DataError, match="COURSE_DATA_MIRROR"):
        data.path("toy", "toy.txt")


def test_unknown_dataset_or_file_is_a_value_error(toy):
    with pytest.raises(ValueError, match="unknown dataset name 'imbd'.*imdb"):
        data.path("imbd")
    with pytest.raises(ValueError, match="has no file 'other.txt'.*toy.txt"):
        data.path("toy", "other.txt")


# ---------------------------------------------------------------- loaders (real data)
def test_load_chatbot_counts_and_quirks(data_mirror):
    rows = data.load_chatbot()
    assert len(rows) == 11_823
    assert set(rows[0]) == {"q", "a", "label"}
    assert Counter(r["label"] for r in rows) == {0: 5_290, 1: 3_570, 2: 2_963}
    assert all(type(r["label"]) is int for r in rows)
    assert rows[10_676]["label"] == 2  # file line 10678, whose label is "2   "
    assert not any("\r" in r["q"] or "\r" in r["a"] for r in rows)  # CRLF handled
    assert all(r["q"] and r["a"] for r in rows)


def test_loaders_hand_out_copies(data_mirror):
    rows = data.load_chatbot()
    original = dict(rows[0])
    rows[0]["q"] = "changed"
    rows.clear()
    assert data.load_chatbot()[0] == original


@pytest.mark.parametrize("split,ones,tens", [("train", 5_100, 4_732), ("test", 5_022, 4_999)])
def test_load_imdb(data_mirror, split, ones, tens):
    rows = data.load_imdb(split)
    assert len(rows) == 25_000
    assert Counter(r["label"] for r in rows) == {0: 12_500, 1: 12_500}
    ratings = Counter(r["rating"] for r in rows)
    assert ratings[1] == ones and ratings[10] == tens
    assert all((r["rating"] <= 4) == (r["label"] == 0) for r in rows)
    assert not any("<br" in r["text"] for r in rows)


def test_load_imdb_unsup_is_text_only_and_disjoint_from_the_labelled_reviews(data_mirror):
    every = data.load_imdb_unsup(exclude_test=False)
    assert len(every) == 50_000 and all(every) and not any("<br />" in t for t in every)
    test = {r["text"] for r in data.load_imdb("test")}
    repeats = sum(t in test for t in every)
    assert 0 < repeats < 0.02 * len(every)                  # a few test reviews recur word for word
    kept = data.load_imdb_unsup()
    assert len(kept) == len(every) - repeats and not any(t in test for t in kept)
    assert data.REGISTRY["imdb_unsup"].files["imdb_unsup.csv.gz"].sha256.startswith("d47b18f1")


def test_load_imdb_rejects_other_splits():
    with pytest.raises(ValueError, match="split.*'validation'"):
        data.load_imdb("validation")


def test_load_tatoeba(data_mirror):
    kor = data.load_tatoeba("kor_eng")
    assert len(kor) == 5_749
    assert kor[0] == {"en": "Go.", "other": "가.",
                      "attribution": "CC-BY 2.0 (France) Attribution: tatoeba.org #2877272 (CM) & #8363271 (Eunhee)"}
    assert all(r["attribution"].startswith("CC-BY 2.0 (France) Attribution: tatoeba.org #") for r in kor)
    assert len({(r["en"], r["other"]) for r in kor}) == 5_749  # all pairs unique

    fra = data.load_tatoeba("fra_eng")
    assert len(fra) == 142_787
    assert {r["attribution"] for r in fra} == {"Attribution: www.manythings.org/anki and tatoeba.org"}
    assert all(r["en"] and r["other"] for r in fra)
    with pytest.raises(ValueError, match="pair"):
        data.load_tatoeba("eng_kor")


def test_load_tinyshakespeare(data_mirror):
    text = data.load_tinyshakespeare()
    assert len(text) == 1_115_394
    assert text.startswith("First Citizen:")
    assert len(set(text)) == 65 and text.count("\n") == 40_000


def test_load_nsmc_raw(data_mirror):
    head = data.load_nsmc_raw(limit=3)
    assert head[0] == {"review_id": 7, "movie_id": 29354, "rating": 6, "date": "03.11.21",
                       "review": "뻔한 스토리지만, 택시 시리즈는 괜찮음..6점"}
    assert len(head) == 3
    rows = data.load_nsmc_raw()
    assert len(rows) == 712_404
    ratings = Counter(r["rating"] for r in rows)
    assert ratings[1] == 73_242 and ratings[10] == 305_856
    assert sum("\n" in r["review"] for r in rows) == 217
    assert sum(r["review"] == "" for r in rows) == 21
    with pytest.raises(ValueError, match="limit"):
        data.load_nsmc_raw(limit=-1)


# ---------------------------------------------------------------- tfds builders and loaders
@pytest.fixture(scope="module")
def tfds_dir(tmp_path_factory):
    """Prepare tfds datasets into a fresh folder, so that preparation itself is tested."""
    with pytest.MonkeyPatch.context() as mp:
        folder = tmp_path_factory.mktemp("tfds")
        mp.setenv("COURSE_TFDS_DIR", str(folder))
        yield folder


def test_split_indices_are_a_deterministic_partition():
    splits = data.split_indices(1_000)
    assert [len(splits[s]) for s in ("train", "validation", "test")] == [800, 100, 100]
    assert sorted(i for part in splits.values() for i in part) == list(range(1_000))
    assert splits == data.split_indices(1_000, seed=data.SPLIT_SEED)
    assert splits["test"] != data.split_indices(1_000, seed=1)["test"]
    assert splits["test"] != list(range(900, 1_000))  # shuffled, not a cut of the file
    with pytest.raises(ValueError, match="n must be"):
        data.split_indices(-1)


@pytest.mark.parametrize("name", sorted(DATASETS - {"imdb_unsup"}))   # plain text for pre-training: no builder
def test_builder_info_has_metadata_and_features(name, tfds_dir):
    info = data.builder(name).info
    registry = REGISTRY[name]
    assert info.description.startswith(registry.description) and registry.license in info.description
    assert info.citation == registry.citation and info.homepage == registry.homepage
    assert info.redistribution_info.license == registry.license
    features = set(info.features.keys())
    expected = {"chatbot_data": {"q", "a", "label"}, "imdb": {"text", "label", "rating"},
                "tatoeba_kor_eng": {"en", "other", "attribution"},
                "tatoeba_fra_eng": {"en", "other", "attribution"}, "tinyshakespeare": {"text"},
                "nsmc_raw": {"review_id", "movie_id", "rating", "date", "review"}}[name]
    assert features == expected


def _read_back(source, batch_size=500):
    """Every row of ``source``, in order, through a torch DataLoader."""
    loader = data.torch_loader(source, batch_size=batch_size, collate_fn=list)
    return [row for batch in loader for row in batch]


@pytest.mark.parametrize("name,load", [("chatbot_data", data.load_chatbot),
                                       ("tatoeba_kor_eng", lambda: data.load_tatoeba("kor_eng"))])
def test_tfds_split_reads_back_the_loader_rows(name, load, data_mirror, tfds_dir):
    rows = load()
    splits = data.split_indices(len(rows))
    for split, indices in splits.items():
        source = data.tfds_source(name, split)
        assert len(source) == len(indices)
        back = _read_back(source)
        assert back == [rows[i] for i in indices], split
        assert all(type(v) in (str, int) for row in back[:50] for v in row.values())
    info = data.builder(name).info
    assert {s: info.splits[s].num_examples for s in splits} == {s: len(i) for s, i in splits.items()}
    assert (tfds_dir / f"course_{name}").is_dir()
    assert any(p.name.endswith(".array_record-00000-of-00001") for p in (tfds_dir / f"course_{name}").rglob("*"))


def test_tfds_tinyshakespeare_is_nanogpts_split(data_mirror, tfds_dir):
    text = data.load_tinyshakespeare()
    train = "".join(row["text"] for row in data.tfds_source("tinyshakespeare", "train"))
    val = "".join(row["text"] for row in data.tfds_source("tinyshakespeare", "validation"))
    assert (len(train), len(val)) == (1_003_854, 111_540)
    assert train + val == text


# Preparing IMDB (50,000 reviews) takes about 12 s on 2 cores: kept, as it is the one
# builder with official splits and a Scalar feature. NSMC (712k rows) and the French
# Tatoeba pairs (143k) take minutes / ~20 s to prepare and are not prepared here.
def test_tfds_imdb_keeps_the_official_splits(data_mirror, tfds_dir):
    for split in ("train", "test"):
        rows = data.load_imdb(split)
        source = data.tfds_source("imdb", split)
        assert len(source) == 25_000
        for i in (0, 12_499, 12_500, 24_999):
            assert source[i] == rows[i]
        assert source[-1] == rows[-1]


def test_tfds_source_rejects_unknown_names(tfds_dir, data_mirror):
    with pytest.raises(ValueError, match="unknown dataset name"):
        data.tfds_source("chatbot", "train")
    with pytest.raises(ValueError, match="splits.*'dev'"):
        data.tfds_source("chatbot_data", "dev")


def test_torch_loader_shuffles_reproducibly_and_collates():
    rows = [{"text": f"row {i}", "label": i % 2} for i in range(10)]

    def order(seed):
        return [t for batch in data.torch_loader(rows, batch_size=4, shuffle=True, seed=seed)
                for t in batch["text"]]

    assert order(0) == order(0)
    assert order(0) != order(1)
    assert sorted(order(0)) == sorted(r["text"] for r in rows)
    first = next(iter(data.torch_loader(rows, batch_size=4)))
    assert first["text"] == ["row 0", "row 1", "row 2", "row 3"]
    assert torch.equal(first["label"], torch.tensor([0, 1, 0, 1]))


def test_torch_loader_checks_its_arguments():
    with pytest.raises(ValueError, match="batch_size must be >= 1, got 0"):
        data.torch_loader([1, 2, 3], batch_size=0)
    with pytest.raises(TypeError, match="source"):
        data.torch_loader(iter([1, 2, 3]), batch_size=2)
