"""The translation family: chapter checkpoints trained on sentence pairs, not on a packed corpus.

Chapter 1's two recurrent translators (a fixed context against Luong attention) are trained here by
the same command, loop, resume and card as the pretrained models (``python -m tools.pretrain
s2s-attention-fra-eng``). What differs from a language-model recipe is the data and its unit:

* the data is ``lib.translation.split_pairs`` of the English-French Tatoeba pairs, the split every
  translation chapter uses (a held-out English sentence is never trained on, in any of its
  translations), with one word vocabulary per side built from the training pairs only;
* a step reads ``batch_size`` *pairs* (batches of similar length, ``lib.train.LengthBucketSampler``),
  so the recipe's budget and its cards count pairs where the other recipes count tokens
  (``Recipe.unit``);
* the held-out loss is the teacher-forced cross-entropy per target word on a fixed sample of held-out
  pairs (each held-out English sentence with its first French translation).

The scratch folder holds the two vocabularies and ``data.json``; the pairs themselves are split again
from the corpus when a run starts or resumes (a few seconds, and always the same split).
"""
from __future__ import annotations

import hashlib
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from lib import checkpoints, train
from lib.io import atomic_write, sha256 as file_sha256

#: checkpoint kinds of this family (lib.checkpoints.MODEL_KINDS keys)
PAIR_KINDS = frozenset({"seq2seq"})
TARGET_TOKENIZER = "target_tokenizer.json"

#: corpus name -> (lib.data.load_tatoeba pair, the data files it reads)
PAIR_CORPORA = {"tatoeba-fra-eng": ("fra_eng", (("tatoeba_fra_eng", "fra.txt.gz"),))}


def split(recipe):
    """The recipe's training pairs and held-out references (``lib.translation.split_pairs``, lower-cased
    words and punctuation, pairs over ``recipe.seq_len`` words on either side dropped from training)."""
    from lib import data, text, translation
    pair, _ = PAIR_CORPORA[recipe.corpus]
    return translation.split_pairs(data.load_tatoeba(pair), tokenize=text.simple_tokenize,
                                   max_tokens=recipe.seq_len, seed=recipe.seed)


def _digest(pairs) -> str:
    h = hashlib.sha256()
    for s, t in pairs:
        h.update(" ".join(s).encode("utf-8") + b"\t" + " ".join(t).encode("utf-8") + b"\n")
    return h.hexdigest()


def prepare(recipe, folder: Path, fingerprint: dict) -> dict:
    """The split and the two word vocabularies (``tokenizer.json`` English, ``target_tokenizer.json``
    French), saved in ``folder`` with ``data.json``."""
    from lib import data
    from lib.text import WordVocab
    start = time.perf_counter()
    pairs = split(recipe)
    src = WordVocab.build((s for s, _ in pairs.train_pairs), max_size=recipe.vocab_size)
    tgt = WordVocab.build((t for _, t in pairs.train_pairs), max_size=recipe.target_vocab_size)
    folder.mkdir(parents=True, exist_ok=True)
    src.save(folder / "tokenizer.json")
    tgt.save(folder / TARGET_TOKENIZER)
    _, files = PAIR_CORPORA[recipe.corpus]
    heldout_pairs = sum(len(r) for r in pairs.references.values())
    return {"fingerprint": fingerprint, "documents": len(pairs.train_pairs) + heldout_pairs,
            "heldout_documents": heldout_pairs, "train_tokens": len(pairs.train_pairs),
            "heldout_tokens": heldout_pairs,
            "counts": {"training_pairs": len(pairs.train_pairs), "heldout_sentences": len(pairs.references),
                       "heldout_pairs": heldout_pairs,
                       "training_words": {"english": sum(len(s) for s, _ in pairs.train_pairs),
                                          "french": sum(len(t) for _, t in pairs.train_pairs)}},
            "corpus_sha256": _digest(pairs.train_pairs),
            "datasets": [{"dataset": d, "file": name, "sha256": data.REGISTRY[d].files[name].sha256}
                         for d, name in files],
            "tokenizer_sha256": file_sha256(folder / "tokenizer.json"), "vocab_size": len(src),
            "target_vocab_size": len(tgt), "target_tokenizer_sha256": file_sha256(folder / TARGET_TOKENIZER),
            "seconds": round(time.perf_counter() - start, 1)}


def model_config(recipe, src_vocab: int, tgt_vocab: int) -> dict:
    return {**recipe.model, "src_vocab_size": src_vocab, "tgt_vocab_size": tgt_vocab}


def heldout_pairs(recipe, references: dict, src, tgt) -> list[tuple[list[int], list[int]]]:
    """A fixed sample of ``recipe.heldout_sequences`` held-out pairs, each held-out English sentence with
    its first translation (sentences in a seeded random order, so that every length is represented)."""
    from lib.text import simple_tokenize as tok
    sentences = list(references)
    order = torch.randperm(len(sentences), generator=torch.Generator().manual_seed(recipe.seed + 1)).tolist()
    chosen = [sentences[i] for i in order[:recipe.heldout_sequences]]
    return [(src.encode(tok(s)), tgt.encode(tok(references[s][0]))) for s in chosen]


def build_training(recipe, folder: Path) -> tuple:
    """(source vocabulary, the training loader, the fixed held-out batches, the model from the seed)."""
    from lib.text import WordVocab, collate_pairs
    src, tgt = WordVocab.load(folder / "tokenizer.json"), WordVocab.load(folder / TARGET_TOKENIZER)
    pairs = split(recipe)
    ids = [(src.encode(s), tgt.encode(t)) for s, t in pairs.train_pairs]
    collate = collate_pairs(src.pad_id)
    held = heldout_pairs(recipe, pairs.references, src, tgt)
    heldout = [collate(held[i:i + 128]) for i in range(0, len(held), 128)]
    sampler = train.LengthBucketSampler([len(s) for s, _ in ids], recipe.batch_size, seed=recipe.seed)
    loader = torch.utils.data.DataLoader(ids, batch_sampler=sampler, collate_fn=collate)
    torch.manual_seed(recipe.seed)
    model = checkpoints.build_model(recipe.kind, model_config(recipe, len(src), len(tgt)))
    return src, loader, heldout, model


def step(model, batch):
    """The teacher-forced cross-entropy per real target word (``Seq2Seq.loss``)."""
    return model.loss(*batch), {}


@torch.no_grad()
def heldout_loss(model, batches: list) -> float:
    """Mean teacher-forced cross-entropy per held-out target word (eval mode, float32)."""
    was = model.training
    model.eval()
    total = count = 0.0
    where = next(model.parameters()).device
    for src, src_len, tgt_in, tgt_out in batches:
        tgt_out = tgt_out.to(where)
        logits, _ = model(src.to(where), src_len, tgt_in.to(where))
        real = tgt_out != model.cfg.pad_id
        total += F.cross_entropy(logits.float()[real], tgt_out[real], reduction="sum").item()
        count += real.sum().item()
    model.train(was)
    return total / count


def copy_target_tokenizer(scratch_data: Path, out: Path, name: str) -> str | None:
    """Put the target vocabulary beside the checkpoint (when the run has one); its relative path."""
    src = scratch_data / TARGET_TOKENIZER
    if not src.is_file():
        return None
    relative = f"{name}/{TARGET_TOKENIZER}"
    dst = out / relative
    if not dst.is_file() or file_sha256(dst) != file_sha256(src):
        with atomic_write(dst, "wb") as f:
            f.write(src.read_bytes())
    return relative
