"""The language-model family: the pretraining corpora (never a test item of the chapters that use
them), their tokenizers and packed token streams (``prepare``), the packed datasets of each objective
(masked LM, knowledge masking, causal LM, BART's denoising, T5's span corruption, ELMo's biLM) and
their training steps."""
from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

from lib.data import mlm
from lib.io import atomic_write, sha256 as file_sha256
from lib.train.loaders import epoch_seed
from tools.pretrain import characters, reviews, tasks, translation
from tools.pretrain.recipes import T5_SENTINELS, Recipe


def _nsmc(limit: int | None = None) -> tuple[list[str], dict]:
    from lib.data import load_nsmc_raw
    from lib.data.nsmc_corpus import pretraining_reviews
    return pretraining_reviews(load_nsmc_raw(limit=limit))


def _imdb() -> tuple[list[str], dict]:
    """IMDB's 25,000 training reviews and its 50,000 unlabelled ones, without any text of a test review."""
    from lib.data import load_imdb, load_imdb_unsup
    test = {r["text"] for r in load_imdb("test")}
    labelled = [r["text"] for r in load_imdb("train")]
    unlabelled = load_imdb_unsup(exclude_test=True)
    texts = [t for t in labelled + unlabelled if t not in test]
    return texts, {"train_reviews": len(labelled), "unsup_reviews": len(unlabelled),
                   "same_text_as_a_test_review": len(labelled) + len(unlabelled) - len(texts), "reviews": len(texts)}


T5_IMDB_REVIEWS = 10_000      # t5-mix: English reviews kept (about 3M tokens), so that French is not drowned


def _t5_mix() -> tuple[list[str], dict]:
    """Chapter 11's three languages, and never one of its test items: Korean reviews (the NSMC crawl
    without its test side), English reviews (IMDB's training and unlabelled ones, ``T5_IMDB_REVIEWS``
    of them), the English and the French sentences of the Tatoeba pairs whose English sentence is not
    held out (each sentence a document of its own, so no translation pair is ever read together; a
    French sentence that translates a held-out one is left out too), and the chatbot's questions and
    answers whose question is not held out. A document whose text is a held-out sentence or one of its
    translations, or a held-out question or its answer, is dropped, whatever its source. Shuffled together with a fixed seed."""
    import random

    from lib.data import load_chatbot, load_tatoeba
    from lib.translation import is_held_out
    korean, nsmc_counts = _nsmc()
    english_reviews, _ = _imdb()
    english_reviews = [english_reviews[i] for i in
                       sorted(random.Random(0).sample(range(len(english_reviews)), T5_IMDB_REVIEWS))]
    pairs = load_tatoeba("fra_eng")
    held_french = {r["other"] for r in pairs if is_held_out(r["en"])}
    kept = [r for r in pairs if not is_held_out(r["en"])]
    english_sentences = sorted({r["en"] for r in kept})
    french_sentences = sorted({r["other"] for r in kept} - held_french)
    chatbot = load_chatbot()
    chat = [t for r in chatbot if not is_held_out(r["q"]) for t in (r["q"], r["a"])]
    held = ({r["en"] for r in pairs if is_held_out(r["en"])} | held_french
            | {t for r in chatbot if is_held_out(r["q"]) for t in (r["q"], r["a"])})
    everything = korean + english_reviews + english_sentences + french_sentences + chat
    docs = [d for d in everything if d not in held]      # e.g. a review that reads "Life goes on."
    random.Random(0).shuffle(docs)
    return docs, {"korean_reviews": len(korean), "english_reviews": len(english_reviews),
                  "english_sentences": len(english_sentences), "french_sentences": len(french_sentences),
                  "chatbot_texts": len(chat), "same_text_as_a_held_out_sentence": len(everything) - len(docs),
                  "nsmc": nsmc_counts, "documents": len(docs)}


#: corpus name -> (function returning (documents, counts), the data files it reads)
CORPORA: dict[str, tuple[Callable[[], tuple[list[str], dict]], tuple[tuple[str, str], ...]]] = {
    "nsmc": (_nsmc, (("nsmc_raw", "nsmc_raw_reviews.csv.gz"),)),
    "nsmc-first-3000": (lambda: _nsmc(limit=3000), (("nsmc_raw", "nsmc_raw_reviews.csv.gz"),)),
    "imdb": (_imdb, (("imdb", "imdb_train.csv.gz"), ("imdb", "imdb_test.csv.gz"),
                     ("imdb_unsup", "imdb_unsup.csv.gz"))),
    "t5-mix": (_t5_mix, (("nsmc_raw", "nsmc_raw_reviews.csv.gz"), ("imdb", "imdb_train.csv.gz"),
                         ("imdb", "imdb_test.csv.gz"), ("imdb_unsup", "imdb_unsup.csv.gz"),
                         ("tatoeba_fra_eng", "fra.txt.gz"), ("chatbot_data", "ChatbotData.csv"))),
}


def _digest(texts: list[str]) -> str:
    h = hashlib.sha256()
    for t in texts:
        h.update(t.encode("utf-8"))
        h.update(b"\0")
    return h.hexdigest()


def _data_fingerprint(recipe: Recipe) -> dict:
    fingerprint = {"corpus": recipe.corpus, "tokenizer": recipe.tokenizer, "vocab_size": recipe.vocab_size,
                   "lowercase": recipe.lowercase, "kind": recipe.kind, "heldout_every": recipe.heldout_every}
    if recipe.masking != "token":           # (token masking needs no units: its old caches stay valid)
        fingerprint["masking"] = recipe.masking
    if recipe.unit == "pairs":              # the split drops pairs over seq_len words; two vocabularies
        fingerprint.update(seq_len=recipe.seq_len, target_vocab_size=recipe.target_vocab_size, seed=recipe.seed)
        if recipe.tasks:                    # t5-task: the counts name the tasks and the examples per task
            fingerprint.update(tasks=list(recipe.tasks), tokens=recipe.tokens)
    elif recipe.unit == "reviews":          # the reviews are cut at seq_len; the validation share
        fingerprint.update(seq_len=recipe.seq_len, validation=recipe.validation)
    elif recipe.tokenizer == "words":       # the words' byte table is cut at max_chars
        fingerprint["max_chars"] = recipe.model["max_chars"]
    return fingerprint


def word_streams(training: list[str], heldout: list[str], vocab_size: int, max_chars: int) -> tuple[dict, Any]:
    """ELMo's data: every review as ``<S> words </S>`` (words split at spaces), the training and held-out
    reviews each packed into one stream of *type* ids (every distinct word read, rare or not), with
    the tables that turn a type into the model's inputs and targets: ``type_bytes`` (its UTF-8 byte ids,
    ``lib.models.elmo.encode_word``) and ``type_target`` (its id in the word vocabulary the softmax
    predicts, the ``vocab_size`` most frequent training words; ``[UNK]`` for the rest). Returns the
    streams and the vocabulary."""
    from lib.models import elmo
    from lib.text import WordVocab

    train_words = [t.split() for t in training]
    vocab = WordVocab.build(train_words, max_size=vocab_size)
    types: dict[str, int] = {elmo.BOS: 0, elmo.EOS: 1}

    def stream(docs: list[list[str]]) -> torch.Tensor:
        out: list[int] = []
        for words in docs:
            out += [0, *(types.setdefault(w, len(types)) for w in words), 1]
        return torch.tensor(out, dtype=torch.int32)

    streams = {"train": stream(train_words), "heldout": stream([t.split() for t in heldout])}
    names = list(types)                     # in id order
    streams["type_bytes"] = torch.tensor([elmo.encode_word(w, max_chars) for w in names], dtype=torch.int16)
    streams["type_target"] = torch.tensor([vocab.bos_id, vocab.eos_id, *vocab.encode(names[2:])], dtype=torch.int32)
    return streams, vocab


def unit_streams(docs: list[str], tok, chunk: int = 20_000, say: Callable[[str], None] = print
                 ) -> dict[str, torch.Tensor]:
    """The phrase and entity units of ``docs`` as streams aligned with their token stream (the tokens
    of each document, then one separator): per token the number of the unit that covers it, -1 for
    none and for the separators (:func:`lib.data.knowledge_masking.unit_index`). Kiwi reads the text
    the tokenizer read, and the tokenizer's offsets point into that text, so a unit's character
    span maps onto the tokens that overlap it."""
    from lib.data import knowledge_masking as km
    chunker = km.KoreanChunker(num_workers=-1)     # preparing the data runs alone: all cores
    out: dict[str, list[int]] = {"phrase": [], "entity": []}
    numbered = {"phrase": 0, "entity": 0}
    start = time.perf_counter()
    for s in range(0, len(docs), chunk):
        texts = docs[s:s + chunk]
        morphemes = chunker.analyse_batch(texts)
        for enc, morphs in zip(tok.hf.encode_batch(texts, add_special_tokens=False), morphemes):
            n = len(enc.ids)
            for level, spans_of in (("phrase", km.phrase_spans), ("entity", km.entity_spans)):
                spans = km.token_spans(enc.offsets, spans_of(morphs))
                out[level] += [*km.unit_index(n, spans, first=numbered[level]), -1]
                numbered[level] += len(spans)
        say(f"  units: {min(s + chunk, len(docs)):,} of {len(docs):,} documents analysed "
            f"({time.perf_counter() - start:.0f} s)")
    return {level: torch.tensor(v, dtype=torch.int32) for level, v in out.items()}


def split_documents(recipe: Recipe, texts: list[str]) -> tuple[list[str], list[str]]:
    """(training, held out): every ``heldout_every``-th document is held out."""
    return ([t for i, t in enumerate(texts) if i % recipe.heldout_every != 0],
            [t for i, t in enumerate(texts) if i % recipe.heldout_every == 0])


def subword_stream(recipe: Recipe, tok, docs: list[str]) -> torch.Tensor:
    """The documents' ids in one stream, each followed by ``[SEP]`` (BERT) or ``[EOS]`` (the others)."""
    sep = tok.sep_id if recipe.kind == "bert-mlm" else tok.eos_id
    ids = [i for seq in tok.encode_batch(docs) for i in (*seq, sep)]
    return torch.tensor(ids, dtype=torch.int16 if tok.vocab_size < 2 ** 15 else torch.int32)


def _units(part: str, docs: list[str], tok, stream: torch.Tensor) -> dict[str, torch.Tensor]:
    out = {}
    for level, units in unit_streams(docs, tok).items():
        if len(units) != len(stream):
            raise RuntimeError(f"the {level} units of the {part} documents have {len(units):,} entries "
                               f"for {len(stream):,} tokens: the tokenizer and Kiwi disagree")
        out[f"{part}_{level}"] = units
    return out


def heldout_batches(recipe: Recipe, streams: dict, tok) -> list:
    """The fixed held-out batches a run is scored on: the first ``heldout_sequences`` held-out examples
    (their masks drawn from ``seed + 1``), in batches of 64."""
    held = make_dataset(recipe, streams, "heldout", tok, recipe.seed + 1)
    items = [held[i] for i in range(min(recipe.heldout_sequences, len(held)))]
    return [tuple(torch.stack(t) for t in zip(*items[i:i + 64])) for i in range(0, len(items), 64)]


def rebuild_heldout(recipe: Recipe, tok, corpus_sha256: str) -> list:
    """A finished run's held-out batches, rebuilt from its corpus and its shipped tokenizer ``tok``
    (what ``tools.pretrain.restore`` scores), after checking that the corpus is the one it read."""
    if recipe.tokenizer == "words":
        raise SystemExit(f"{recipe.name}: an ELMo run's held-out stream numbers every word it read, training words "
                         "included, and is not rebuilt from its vocabulary: train it again to store it otherwise")
    texts, _ = CORPORA[recipe.corpus][0]()
    if _digest(texts) != corpus_sha256:
        raise SystemExit(f"{recipe.name}: the {recipe.corpus} corpus is not the one the checkpoint was trained on "
                         "(another SHA-256): its held-out documents cannot be rebuilt")
    heldout = split_documents(recipe, texts)[1]
    streams = {"heldout": subword_stream(recipe, tok, heldout)}
    if recipe.masking == "knowledge":
        streams.update(_units("heldout", heldout, tok, streams["heldout"]))
    return heldout_batches(recipe, streams, tok)


def prepare(recipe: Recipe, folder: Path) -> dict:
    """Corpus -> tokenizer -> one token stream for training and one held out, cached in ``folder``
    (``tokenizer.json``, ``streams.pt``, ``data.json``). Done once; a cache for other settings is an error."""
    meta_file = folder / "data.json"
    if meta_file.is_file():
        meta = json.loads(meta_file.read_text())
        if meta["fingerprint"] != _data_fingerprint(recipe):
            raise SystemExit(f"{folder} holds data prepared for {meta['fingerprint']}, not for this recipe: "
                             "run with --fresh (or another --scratch)")
        return meta
    if recipe.unit in ("pairs", "reviews") or recipe.tokenizer == "characters":
        family = (tasks if recipe.kind == tasks.KIND else translation if recipe.unit == "pairs" else
                  reviews if recipe.unit == "reviews" else characters)
        meta = family.prepare(recipe, folder, _data_fingerprint(recipe))
        with atomic_write(meta_file, "w", encoding="utf-8") as f:
            json.dump(meta, f, indent=1, ensure_ascii=False)
        return meta
    from lib import data
    from lib.text import train_tokenizer

    start = time.perf_counter()
    fn, files = CORPORA[recipe.corpus]
    texts, counts = fn()
    training, heldout = split_documents(recipe, texts)
    if recipe.tokenizer == "words":
        streams, tok = word_streams(training, heldout, recipe.vocab_size, recipe.model["max_chars"])
    else:
        tok = train_tokenizer(training, kind=recipe.tokenizer, vocab_size=recipe.vocab_size,
                              lowercase=recipe.lowercase)
        streams = {"train": subword_stream(recipe, tok, training), "heldout": subword_stream(recipe, tok, heldout)}
    if recipe.masking == "knowledge":
        for part, docs in (("train", training), ("heldout", heldout)):
            streams.update(_units(part, docs, tok, streams[part]))
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(folder / "tokenizer.json")
    with atomic_write(folder / "streams.pt", "wb") as f:
        torch.save(streams, f)
    meta = {"fingerprint": _data_fingerprint(recipe), "counts": counts, "documents": len(texts),
            "heldout_documents": len(heldout), "train_tokens": len(streams["train"]),
            "heldout_tokens": len(streams["heldout"]), "corpus_sha256": _digest(texts),
            "datasets": [{"dataset": d, "file": name, "sha256": data.REGISTRY[d].files[name].sha256}
                         for d, name in files],
            "tokenizer_sha256": file_sha256(folder / "tokenizer.json"), "vocab_size": tok.vocab_size,
            "seconds": round(time.perf_counter() - start, 1)}
    with atomic_write(meta_file, "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=1, ensure_ascii=False)
    return meta


class PackedMLM(torch.utils.data.Dataset):
    """``[CLS]`` + ``seq_len - 1`` tokens of the stream (reviews joined by ``[SEP]``), masked 80/10/10.

    The masks are drawn from the example's index (``GlobalBatchSampler(tag_epoch=True)`` makes it new
    in every epoch): the same in every process and after every resume, with no random state to carry."""

    def __init__(self, stream: torch.Tensor, seq_len: int, tok, seed: int, mask_prob: float):
        n = (len(stream)) // (seq_len - 1)
        self.chunks = stream[:n * (seq_len - 1)].long().view(n, seq_len - 1)
        self.tok, self.seed, self.mask_prob = tok, seed, mask_prob
        self.special = (tok.pad_id, tok.unk_id, tok.bos_id, tok.eos_id, tok.cls_id, tok.sep_id, tok.mask_id)

    def __len__(self) -> int:
        return len(self.chunks)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.cat([torch.tensor([self.tok.cls_id]), self.chunks[index % len(self.chunks)]])[None]
        g = torch.Generator().manual_seed(epoch_seed(self.seed, index))
        inputs, labels = mlm.mask_tokens(ids, self.tok.mask_id, self.tok.vocab_size, special_ids=self.special,
                                         mask_prob=self.mask_prob, generator=g)
        return inputs[0], labels[0]


class PackedKnowledgeMLM(PackedMLM):
    """ERNIE 1.0's knowledge masking on the packed stream: example ``index`` is masked at level
    ``LEVELS[index % 3]`` (basic tokens, phrases, entities in equal parts, interleaved rather than in
    ERNIE's successive stages), whole units chosen for 15 % of its tokens, then 80/10/10
    (:func:`lib.data.knowledge_masking.mask_units`). Tokens, sequences and data order are those of
    :class:`PackedMLM` on the same stream: only *which* tokens are hidden differs."""

    def __init__(self, stream: torch.Tensor, seq_len: int, tok, seed: int, mask_prob: float,
                 units: dict[str, torch.Tensor]):
        super().__init__(stream, seq_len, tok, seed, mask_prob)
        from lib.data import knowledge_masking as km
        self.km = km
        n = len(self.chunks)
        self.units = {level: u[:n * (seq_len - 1)].long().view(n, seq_len - 1) for level, u in units.items()}

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        km, row = self.km, index % len(self.chunks)
        ids = torch.cat([torch.tensor([self.tok.cls_id]), self.chunks[row]])
        level = km.LEVELS[index % len(km.LEVELS)]
        maskable = [i not in self.special for i in ids.tolist()]
        index_of = [-1] + (self.units[level][row].tolist() if level != "basic" else [-1] * (len(ids) - 1))
        g = torch.Generator().manual_seed(epoch_seed(self.seed, index))
        return km.mask_units(ids, km.units_from_index(index_of, maskable), mask_id=self.tok.mask_id,
                             vocab_size=self.tok.vocab_size, mask_prob=self.mask_prob, generator=g,
                             num_special=max(self.special) + 1)


class PackedLM(torch.utils.data.Dataset):
    """Inputs ``stream[s : s + seq_len]`` and next-token targets ``stream[s + 1 : s + seq_len + 1]``."""

    def __init__(self, stream: torch.Tensor, seq_len: int, *_):
        self.stream, self.seq_len = stream.long(), seq_len
        self.n = (len(stream) - 1) // seq_len

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        s = (index % self.n) * self.seq_len
        chunk = self.stream[s:s + self.seq_len + 1]
        return chunk[:-1], chunk[1:]


class PackedDenoising(torch.utils.data.Dataset):
    """BART's noise on ``seq_len`` tokens of the stream: the reviews in the stretch (split at the
    ``[EOS]`` that ends each, the separators dropped) are permuted, then text infilling hides
    ``mask_prob`` of their tokens (Poisson(3) spans, one ``[MASK]`` each; :func:`lib.data.noising.denoising_pair`).
    Returns ``(source, decoder input, decoder target)`` of fixed shapes: the corrupted ids and ``[EOS]``
    padded to ``seq_len + 8``, ``[BOS]`` + the original and the original + ``[EOS]`` padded to
    ``seq_len + 1`` (the target with ``-100``, ignored). The noise is drawn from the example's index, as in
    :class:`PackedMLM`."""

    def __init__(self, stream: torch.Tensor, seq_len: int, tok, seed: int, mask_prob: float):
        n = len(stream) // seq_len
        self.chunks = stream[:n * seq_len].long().view(n, seq_len)
        self.tok, self.seed, self.mask_prob, self.seq_len = tok, seed, mask_prob, seq_len
        self.source_len = seq_len + 8

    def __len__(self) -> int:
        return len(self.chunks)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        import numpy as np
        from lib.data import noising

        eos, pad = self.tok.eos_id, self.tok.pad_id
        sentences, current = [], []
        for t in self.chunks[index % len(self.chunks)].tolist():
            if t == eos:
                if current:
                    sentences.append(current)
                current = []
            else:
                current.append(t)
        if current:
            sentences.append(current)
        rng = np.random.default_rng(epoch_seed(self.seed, index))
        corrupted, original = noising.denoising_pair(sentences, self.tok.mask_id, rng, mask_ratio=self.mask_prob)
        src = torch.full((self.source_len,), pad, dtype=torch.long)
        src_ids = corrupted[:self.source_len - 1] + [eos]
        src[:len(src_ids)] = torch.tensor(src_ids)
        tgt_in = torch.full((self.seq_len + 1,), pad, dtype=torch.long)
        tgt_out = torch.full((self.seq_len + 1,), mlm.IGNORE_INDEX, dtype=torch.long)
        tgt_in[:len(original) + 1] = torch.tensor([self.tok.bos_id, *original])
        tgt_out[:len(original) + 1] = torch.tensor([*original, eos])
        return src, tgt_in, tgt_out


class PackedSpanCorruption(torch.utils.data.Dataset):
    """T5's span corruption on ``seq_len`` tokens of the stream (``lib.data.span_corruption``): ``mask_prob``
    of them dropped in spans of mean length 3, each span replaced by one sentinel in the input and
    written after it in the target, both ending with ``[EOS]``. The sentinels are the ids after the
    tokenizer's (``T5_SENTINELS`` of them). Every stretch has the same length, so every input and every
    target too. The noise is drawn from the example's index, as in :class:`PackedMLM`."""

    def __init__(self, stream: torch.Tensor, seq_len: int, tok, seed: int, mask_prob: float):
        from lib.data.span_corruption import noise_counts
        n = len(stream) // seq_len
        self.chunks = stream[:n * seq_len].long().view(n, seq_len)
        self.tok, self.seed, self.mask_prob = tok, seed, mask_prob
        self.sentinels = [tok.vocab_size + T5_SENTINELS - 1 - i for i in range(T5_SENTINELS)]
        if noise_counts(seq_len, mask_prob)[1] + 1 > T5_SENTINELS:
            raise ValueError(f"seq_len {seq_len} at mask_prob {mask_prob} needs more than {T5_SENTINELS} sentinels")

    def __len__(self) -> int:
        return len(self.chunks)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        from lib.data.span_corruption import span_corrupt
        g = torch.Generator().manual_seed(epoch_seed(self.seed, index))
        inputs, targets = span_corrupt(self.chunks[index % len(self.chunks)].tolist(), self.sentinels,
                                       self.tok.eos_id, noise_density=self.mask_prob, generator=g)
        return torch.tensor(inputs), torch.tensor(targets)


class PackedWordLM(torch.utils.data.Dataset):
    """ELMo's biLM on the packed word stream (:func:`word_streams`): ``seq_len`` words as byte ids
    ``(seq_len, max_chars)``, their number, and their target ids in the softmax's vocabulary (``-100``
    for a word outside it: read, never predicted). The forward LM predicts each word from those
    before it, the backward LM from those after it (``BiLM.lm_loss``)."""

    def __init__(self, stream: torch.Tensor, seq_len: int, tok, tables: dict[str, torch.Tensor]):
        self.n = len(stream) // seq_len
        self.windows = stream[:self.n * seq_len].long().view(self.n, seq_len)
        self.bytes, self.target, self.unk = tables["type_bytes"], tables["type_target"], tok.unk_id

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        types = self.windows[index % self.n]
        target = self.target[types].long()
        return (self.bytes[types].long(), torch.tensor(len(types)),
                target.masked_fill(target == self.unk, mlm.IGNORE_INDEX))


def masked_logits(model, ids: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
    """The MLM head's logits at the ``chosen`` positions only (BertForPreTraining's ``only_masked``,
    without the NSP head and the loss it would compute besides ours)."""
    return model.mlm(model.bert(ids).last_hidden_state[chosen])


def mlm_step(model, batch):
    """The masked-LM loss, each sequence weighted equally (the mean over its masked tokens, then over
    the batch), so that the mean over processes is the mean over the global batch."""
    ids, labels = batch
    chosen = labels != mlm.IGNORE_INDEX
    per_token = F.cross_entropy(masked_logits(model, ids, chosen).float(), labels[chosen], reduction="none")
    rows = chosen.nonzero()[:, 0]
    weight = 1.0 / (chosen.sum(1).clamp(min=1)[rows] * ids.shape[0])
    return (per_token * weight).sum(), {}


def lm_step(model, batch):
    x, y = batch
    return model(x, y)[1], {}


def denoising_step(model, batch):
    """The decoder's cross-entropy on the original text, each sequence weighted equally (as ``mlm_step``)."""
    src, tgt_in, tgt_out = batch
    real = tgt_out != mlm.IGNORE_INDEX
    per_token = F.cross_entropy(model(src, tgt_in).float().flatten(0, 1), tgt_out.flatten(),
                                ignore_index=mlm.IGNORE_INDEX, reduction="none").view_as(tgt_out)
    return ((per_token * real).sum(1) / real.sum(1).clamp(min=1)).mean(), {}


def span_step(model, batch):
    """T5's cross-entropy on the target (sentinels and the dropped spans), teacher-forced."""
    src, labels = batch
    return model(src, labels=labels)[1], {}


def bilm_step(model, batch):
    """The mean of ELMo's two language-model losses (forward and backward)."""
    return model.lm_loss(*batch)[0], {}


STEP_FNS: dict[str, Callable] = {"bert-mlm": mlm_step, "gpt-lm": lm_step, "bart-denoise": denoising_step,
                                 "elmo-bilm": bilm_step, "t5-span": span_step}
DATASETS = {"bert-mlm": PackedMLM, "gpt-lm": PackedLM, "bart-denoise": PackedDenoising,
            "t5-span": PackedSpanCorruption}


def make_dataset(recipe: Recipe, streams: dict, part: str, tok, seed: int) -> torch.utils.data.Dataset:
    """The training (``part="train"``) or held-out examples of a prepared run."""
    if recipe.masking == "knowledge":
        units = {level: streams[f"{part}_{level}"] for level in ("phrase", "entity")}
        return PackedKnowledgeMLM(streams[part], recipe.seq_len, tok, seed, recipe.mask_prob, units)
    if recipe.kind == "elmo-bilm":
        return PackedWordLM(streams[part], recipe.seq_len, tok, streams)
    return DATASETS[recipe.kind](streams[part], recipe.seq_len, tok, seed, recipe.mask_prob)
