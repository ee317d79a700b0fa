"""The sentence-pair family: chapter checkpoints trained on (input, output) pairs, not on a packed corpus.

The models a chapter's headline rests on, trained by the same command, loop, resume and card as the
pretrained models (``python -m tools.pretrain s2s-attention-fra-eng``):

* chapter 1's two recurrent translators (``seq2seq``: one fixed context against Luong attention) and
  chapter 3's Transformer translator (``transformer``), English -> French on the Tatoeba pairs, split
  by ``lib.translation.split_pairs`` as every translation chapter splits them (a held-out English
  sentence is never trained on, in any of its translations), one word vocabulary per side built from
  the training pairs only;
* chapter 4's Korean chatbot (``transformer``), on the chatbot pairs split by distinct question
  (``lib.data.chatbot.heldout_split``, 5 % held out), one BPE vocabulary for questions and answers
  trained on the training pairs only;
* chapter 10's chatbots (``bart-chat``): the course's BART (``init_from="bart-ko"``: its tokenizer, its
  network and its weights) fine-tuned on the same pairs, and the same network and tokenizer from random
  weights (``init_weights=False``). The encoder reads the question and ``[EOS]``, as BART was pretrained.
  Their recipes hold out a validation split of the training questions (``validation``): the run's
  held-out loss is read there, and the checkpoint keeps the weights where it was lowest
  (``keep_best``), so the test pairs choose nothing.

What differs from a language-model recipe is the data and its unit: a step reads ``batch_size``
*pairs* (batches of similar source length, ``lib.train.LengthBucketSampler``), so the recipe's budget
and its card count pairs where the other recipes count tokens (``Recipe.unit``); the held-out loss is
the teacher-forced cross-entropy per real target token (no label smoothing, eval mode) on a fixed
sample of held-out pairs (a translation: each held-out English sentence with its first translation).

The scratch folder holds the vocabularies and ``data.json``; the pairs are split again from the
corpus when a run starts or resumes (a few seconds, always the same split).
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from lib import checkpoints, train
from lib.io import sha256 as file_sha256

#: checkpoint kinds this family trains (lib.checkpoints.MODEL_KINDS keys)
PAIR_KINDS = frozenset({"seq2seq", "transformer", "bart-chat", "t5-task"})
#: kinds whose network, tokenizer and (unless init_weights is False) weights come from a registered checkpoint
INIT_KINDS = frozenset({"bart-chat", "t5-task"})
VALIDATION_SEED = 1      # the validation split of the training questions: the same for every arm and seed
TARGET_TOKENIZER = "target_tokenizer.json"

#: corpus name -> the data files it reads
PAIR_CORPORA = {"tatoeba-fra-eng": (("tatoeba_fra_eng", "fra.txt.gz"),),
                "chatbot-ko": (("chatbot_data", "ChatbotData.csv"),)}


@dataclass
class PairSplit:
    """Training and held-out pairs, as text (``str``) or as word lists (a word-vocabulary corpus)."""
    train: list
    heldout: list            # the fixed held-out sample the loss is measured on
    counts: dict


def split(recipe) -> PairSplit:
    """The recipe's training pairs and held-out sample."""
    from lib import data
    if recipe.corpus == "tatoeba-fra-eng":     # lower-cased words and punctuation; over seq_len words dropped
        from lib import text, translation
        pairs = translation.split_pairs(data.load_tatoeba("fra_eng"), tokenize=text.simple_tokenize,
                                        max_tokens=recipe.seq_len, seed=recipe.seed)
        held = [(text.simple_tokenize(s), text.simple_tokenize(t))      # a seeded random order: every length
                for s, t in translation.heldout_sample(pairs.references, recipe.heldout_sequences, recipe.seed + 1)]
        n_held = sum(len(r) for r in pairs.references.values())
        return PairSplit(pairs.train_pairs, held, {
            "training_pairs": len(pairs.train_pairs), "heldout_sentences": len(pairs.references),
            "heldout_pairs": n_held, "training_words": {"english": sum(len(s) for s, _ in pairs.train_pairs),
                                                        "french": sum(len(t) for _, t in pairs.train_pairs)}})
    if recipe.corpus == "chatbot-ko":          # chapter 4's split by distinct question (always its seed, 0)
        from lib.data.chatbot import heldout_split
        rows = data.load_chatbot()
        s = heldout_split(rows, fraction=0.05, seed=0)
        train_pairs = [(s.questions[i], s.answers[i]) for i in s.train]
        held = [(s.questions[i], s.answers[i]) for i in s.heldout]
        counts = {"pairs": len(rows), "distinct_questions": len(set(s.questions)), "training_pairs": len(train_pairs),
                  "heldout_pairs": len(held)}
        if recipe.validation:               # a share of the training questions, by question again
            v = heldout_split([{"q": q, "a": a} for q, a in train_pairs], fraction=recipe.validation,
                              seed=VALIDATION_SEED)
            train_pairs = [(v.questions[i], v.answers[i]) for i in v.train]
            held = [(v.questions[i], v.answers[i]) for i in v.heldout]
            counts.update(training_pairs=len(train_pairs), validation_pairs=len(held), heldout_pairs=len(held),
                          test_pairs_never_read=counts["heldout_pairs"])
        return PairSplit(train_pairs, held[:recipe.heldout_sequences], counts)
    if recipe.validation:
        raise SystemExit(f"recipe {recipe.name}: a validation split is drawn from the chatbot's questions only, "
                         f"not from {recipe.corpus!r}")
    raise SystemExit(f"recipe {recipe.name}: unknown pair corpus {recipe.corpus!r} (expected one of "
                     f"{', '.join(PAIR_CORPORA)})")


def _digest(pairs) -> str:
    h = hashlib.sha256()
    for s, t in pairs:
        s, t = (x if isinstance(x, str) else " ".join(x) for x in (s, t))
        h.update(s.encode("utf-8") + b"\t" + t.encode("utf-8") + b"\n")
    return h.hexdigest()


def _vocabularies(recipe, pairs: PairSplit) -> tuple:
    """(source, target) vocabularies from the training pairs: a word vocabulary per side, or one BPE
    tokenizer for both (the same object twice), or the ``init_from`` checkpoint's tokenizer."""
    if recipe.init_from is not None:
        from lib.text import load_vocabulary
        tok = load_vocabulary(checkpoints.path(recipe.init_from, "tokenizer"))
        return tok, tok
    if recipe.tokenizer == "words":
        from lib.text import WordVocab
        return (WordVocab.build((s for s, _ in pairs.train), max_size=recipe.vocab_size),
                WordVocab.build((t for _, t in pairs.train), max_size=recipe.target_vocab_size))
    from lib.text import train_tokenizer
    # the questions, then the answers (chapter 4's order: the same merges and ids as the page's own)
    tok = train_tokenizer([s for s, _ in pairs.train] + [t for _, t in pairs.train], kind=recipe.tokenizer,
                          vocab_size=recipe.vocab_size, lowercase=recipe.lowercase)
    return tok, tok


def load_vocabularies(folder: Path) -> tuple:
    """(source, target) vocabularies of the prepared data: the target's own file when it has one."""
    from lib.text import load_vocabulary
    src = load_vocabulary(folder / "tokenizer.json")
    target = folder / TARGET_TOKENIZER
    return src, load_vocabulary(target) if target.is_file() else src


def prepare(recipe, folder: Path, fingerprint: dict) -> dict:
    """The split and the vocabularies (``tokenizer.json``, and ``target_tokenizer.json`` for a word
    vocabulary per side), saved in ``folder``; returns what ``data.json`` holds."""
    from lib import data
    start = time.perf_counter()
    pairs = split(recipe)
    src, tgt = _vocabularies(recipe, pairs)
    folder.mkdir(parents=True, exist_ok=True)
    src.save(folder / "tokenizer.json")
    meta = {"fingerprint": fingerprint, "documents": pairs.counts["training_pairs"] + pairs.counts["heldout_pairs"],
            "heldout_documents": pairs.counts["heldout_pairs"], "train_tokens": len(pairs.train),
            "heldout_tokens": pairs.counts["heldout_pairs"], "counts": pairs.counts,
            "corpus_sha256": _digest(pairs.train),
            "datasets": [{"dataset": d, "file": name, "sha256": data.REGISTRY[d].files[name].sha256}
                         for d, name in PAIR_CORPORA[recipe.corpus]],
            "tokenizer_sha256": file_sha256(folder / "tokenizer.json"), "vocab_size": src.vocab_size}
    if recipe.validation:
        meta["heldout_rule"] = (f"a validation split of {recipe.validation:.0%} of the training questions held out "
                                "(chapter 4's held-out test pairs are never read)")
    if recipe.init_from is not None:
        meta["init_from"] = init_meta(recipe)
    if tgt is not src:
        tgt.save(folder / TARGET_TOKENIZER)
        meta.update(target_vocab_size=tgt.vocab_size, target_tokenizer_sha256=file_sha256(folder / TARGET_TOKENIZER))
    return {**meta, "seconds": round(time.perf_counter() - start, 1)}


def model_config(recipe, src_vocab, tgt_vocab) -> dict:
    if recipe.init_from is not None:         # the checkpoint's network, with the recipe's settings (dropout)
        return {**checkpoints.info(recipe.init_from).config, **recipe.model}
    if recipe.kind == "seq2seq":
        return {**recipe.model, "src_vocab_size": src_vocab.vocab_size, "tgt_vocab_size": tgt_vocab.vocab_size}
    # a Transformer: positions for the longest source or target (collate adds [BOS] or [EOS])
    return {**recipe.model, "src_vocab_size": src_vocab.vocab_size, "tgt_vocab_size": tgt_vocab.vocab_size,
            "pad_id": src_vocab.pad_id, "max_len": recipe.model.get("max_len", recipe.seq_len + 1)}


def encode(recipe, pairs: list, src_vocab, tgt_vocab) -> list[tuple[list[int], list[int]]]:
    """Id pairs; a subword corpus keeps the pairs whose source has at most ``seq_len`` pieces and whose
    target fits in ``seq_len`` with its [EOS] (a word corpus was cut at ``seq_len`` words by its split)."""
    ids = [(src_vocab.encode(s), tgt_vocab.encode(t)) for s, t in pairs]
    if recipe.kind == "bart-chat":           # BART's encoder reads the text and [EOS]
        ids = [(s + [src_vocab.eos_id], t) for s, t in ids]
    if recipe.tokenizer == "words":
        return ids
    return [(s, t) for s, t in ids if len(s) <= recipe.seq_len and len(t) + 1 <= recipe.seq_len]


def build_training(recipe, folder: Path, init: bool = True) -> tuple:
    """(source vocabulary, the training loader, the fixed held-out batches, the model from the seed);
    ``init`` False: the model stays at its random weights whatever the recipe (only the data is wanted)."""
    from lib.text import collate_pairs
    src, tgt = load_vocabularies(folder)
    pairs = split(recipe)
    ids = encode(recipe, pairs.train, src, tgt)
    collate = collate_pairs(src.pad_id, bos_id=tgt.bos_id, eos_id=tgt.eos_id)
    held = encode(recipe, pairs.heldout, src, tgt)
    heldout = [collate(held[i:i + 128]) for i in range(0, len(held), 128)]
    sampler = train.LengthBucketSampler([len(s) for s, _ in ids], recipe.batch_size, seed=recipe.seed)
    loader = torch.utils.data.DataLoader(ids, batch_sampler=sampler, collate_fn=collate)
    return src, loader, heldout, initial_model(recipe, folder, model_config(recipe, src, tgt), init)


def init_meta(recipe) -> dict:
    """What ``data.json`` records of the ``init_from`` checkpoint: its name, whether its weights are the
    start, and their SHA-256."""
    return {"name": recipe.init_from, "weights": recipe.init_weights,
            "weights_sha256": checkpoints.info(recipe.init_from).files["weights"].sha256}


def initial_model(recipe, folder: Path, config: dict, init: bool = True):
    """The model from the recipe's seed, with the ``init_from`` checkpoint's weights when the recipe starts
    from them (and ``init``), checked against the weights the prepared data in ``folder`` recorded."""
    torch.manual_seed(recipe.seed)
    model = checkpoints.build_model(recipe.kind, config)
    if recipe.init_from is not None and recipe.init_weights and init:
        start = checkpoints.load(recipe.init_from)
        prepared = json.loads((folder / "data.json").read_text()).get("init_from", {}).get("weights_sha256")
        if prepared != start.info.files["weights"].sha256:
            raise SystemExit(f"{folder} was prepared from other weights of {recipe.init_from} than the registered "
                             "ones: run with --fresh")
        model.load_state_dict(start.model.state_dict())
    return model


def logits(model, batch) -> torch.Tensor:
    """Teacher-forced logits ``(B, T, V)`` of a recurrent or a Transformer encoder-decoder."""
    src, src_len, tgt_in, _ = batch
    if model.__class__.__name__ == "Seq2Seq":
        return model(src, src_len, tgt_in)[0]
    return model(src, tgt_in)


def step_fn(recipe):
    """The training step: the cross-entropy per real target token (a recurrent model's own
    ``Seq2Seq.loss``), with the recipe's label smoothing."""
    def step(model, batch):
        if recipe.kind == "seq2seq" and not recipe.label_smoothing:
            return model.loss(*batch), {}
        tgt_out = batch[3]
        return F.cross_entropy(logits(model, batch).flatten(0, 1), tgt_out.flatten(), ignore_index=model.cfg.pad_id,
                               label_smoothing=recipe.label_smoothing), {}
    return step


@torch.no_grad()
def heldout_loss(model, batches: list) -> float:
    """Mean teacher-forced cross-entropy per real held-out target token (eval mode, float32)."""
    was = model.training
    model.eval()
    total = count = 0.0
    where = next(model.parameters()).device
    for batch in batches:
        batch = [t.to(where) if i != 1 else t for i, t in enumerate(batch)]   # lengths stay on the CPU
        tgt_out = batch[3]
        real = tgt_out != model.cfg.pad_id
        total += F.cross_entropy(logits(model, batch).float()[real], tgt_out[real], reduction="sum").item()
        count += real.sum().item()
    model.train(was)
    return total / count
