#!/usr/bin/env python
"""Pretrain a course checkpoint from committed code: one command per model, resumable, torchrun-ready.

::

    python -m tools.pretrain --list                                 # the recipes
    python -m tools.pretrain ko-bert                                # the recipe's token budget
    python -m tools.pretrain ko-bert --tokens 40M --snapshots 3M,10M --minutes 150
    torchrun --nproc_per_node 2 -m tools.pretrain ko-bert           # data parallel (CPU: gloo)

What a run does
---------------
1. Prepares the data once, in the scratch folder (``--scratch``, default ``.pretrain/<name>/``,
   ignored by git): the recipe's corpus (never a test review), a subword tokenizer trained on it
   and saved (the vocabulary every later use of the checkpoint shares), and the corpus encoded and
   packed into sequences of ``seq_len`` tokens. Every ``heldout_every``-th document is held out
   for the held-out loss.
2. Trains with ``lib.train.fit`` in chunks that end at every evaluation and snapshot: each chunk
   resumes from the checkpoint the previous one left in the scratch folder, so an interrupted run
   (Ctrl-C, a killed job, ``--minutes`` spent) continues exactly where its last checkpoint was when
   the same command runs again: same data order, masks, dropout and learning rate, the result of a run
   never interrupted. The data order is a function of (seed, epoch) and the global batch
   (``lib.train.GlobalBatchSampler``), the masks a function of each example's index, so under
   ``torchrun`` N processes train on exactly the batches one process would (``fit`` averages the
   gradients). One line per chunk: step, tokens, training and held-out loss, tokens per second.
3. Writes the output (``--out``, default ``checkpoints/``, the repository's folder; rank 0 only):
   ``<name>/model.safetensors`` (weights only, in float16 or bfloat16 when the held-out loss with the
   rounded weights is within ``DTYPE_TOLERANCE`` of float32's, else float32), ``tokenizer.json``,
   ``card.json`` and ``card.md``, ``snapshots/`` at the ``--snapshots`` token counts, and the
   registry entries (``lib.checkpoints``), each file to a temporary name first, then renamed.
   Optimizer state never leaves the scratch folder.

``--tokens`` sets the length of the learning-rate schedule (warm-up, then cosine); ``--minutes``
stops this invocation after that much wall time, at a checkpoint (run the command again to go on).
A resumed run must keep the recipe, ``--tokens``, ``--snapshots`` and the number of processes;
``--fresh`` starts over (reusing the prepared data when the recipe's data settings are unchanged).
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import hashlib
import io
import json
import math
import os
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(REPO))

from lib import checkpoints, device, train  # noqa: E402
from lib.data import mlm  # noqa: E402
from lib.io import atomic_write, sha256 as file_sha256  # noqa: E402
from lib.models.t5 import COURSE_SENTINELS  # noqa: E402
from lib.train.checkpoint import read_checkpoint  # noqa: E402
from lib.train.loaders import epoch_seed  # noqa: E402
from tools.pretrain import translation  # noqa: E402

SCRATCH = REPO / ".pretrain"
T5_SENTINELS = COURSE_SENTINELS   # t5-span: <extra_id_0> is the model's last id, <extra_id_31> the 32nd from the end
DTYPE_TOLERANCE = 1e-3      # nats: a stored dtype may change the held-out loss by at most this much
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


# ----------------------------------------------------------------------------- corpora

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


# ----------------------------------------------------------------------------- recipes

#: the optimizers a recipe can name. Adafactor (Shazeer and Stern, 2018) is T5's: its ``lr`` is a relative
#: step, each parameter's update scaled by that parameter's root mean square (``torch.optim.Adafactor``).
#: At the T5 paper's 1e-2 it moves the N(0, 1) shared embedding ten times as far per step as AdamW at
#: 1e-3, and that is what lets a small T5 learn to read its input: with AdamW at 2e-3, t5-mix's
#: first run scored its targets as well after another chunk's input as after its own (chapter 11).
OPTIMIZERS: dict[str, Callable] = {
    "adamw": lambda params, lr, weight_decay: torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay),
    "adafactor": lambda params, lr, weight_decay: torch.optim.Adafactor(params, lr=lr, weight_decay=weight_decay),
    # the Transformer paper's Adam (beta2 0.98, eps 1e-9): chapters 3 and 4
    "adam-transformer": lambda params, lr, weight_decay: torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.98), eps=1e-9,
                                                                          weight_decay=weight_decay),
}
#: learning-rate schedules: "cosine" (linear warm-up over ``warmup`` of the steps, then cosine to
#: ``min_lr_ratio`` x lr) or "inverse-sqrt" (the Transformer paper's, warm-up over ``warmup`` of the steps,
#: then 1/sqrt(step), scaled by d_model^-0.5 and by lr: chapter 4's chatbot)
SCHEDULES = ("cosine", "inverse-sqrt")


@dataclass(frozen=True)
class Recipe:
    """Everything a pretraining run depends on (besides the token budget and the snapshots)."""
    name: str
    kind: str                       # a lib.checkpoints.MODEL_KINDS key: bert-mlm, gpt-lm, bart-denoise, elmo-bilm, t5-span,
                                    # or seq2seq (the translation family: tools/pretrain/translation.py)
    description: str
    corpus: str                     # a CORPORA key, or a translation.PAIR_CORPORA key for the translation family
    model: dict                     # model configuration (vocabulary size and length are added)
    tokenizer: str = "bpe"          # lib.text.train_tokenizer kind ("bpe", "wordpiece"), or "words" (elmo-bilm)
    vocab_size: int = 8000
    lowercase: bool = False
    seq_len: int = 64               # tokens per packed sequence; translation: the longest training sentence, in words
    unit: str = "tokens"            # what a step's batch counts: "tokens" (packed sequences) or "pairs" (translation)
    target_vocab_size: int | None = None  # translation: the target side's vocabulary (vocab_size is the source's)
    clip_grad: float | None = None  # gradient-norm clipping (lib.train.fit's clip_grad)
    label_smoothing: float = 0.0    # translation family: the training loss's label smoothing
    schedule: str = "cosine"        # a SCHEDULES entry
    batch_size: int = 64            # sequences per optimizer step, all processes together
    optimizer: str = "adamw"        # a OPTIMIZERS key: "adamw", or "adafactor" (T5's, lr a relative step)
    lr: float = 1e-3
    weight_decay: float = 0.01
    warmup: float = 0.05            # share of the steps
    min_lr_ratio: float = 0.1       # the cosine ends at lr * min_lr_ratio
    tokens: int = 40_000_000        # default length of the schedule
    eval_every_tokens: int = 1_000_000
    log_every_tokens: int = 100_000  # how often the averaged training loss goes to the history
    heldout_every: int = 100        # every 100th document is held out
    heldout_sequences: int = 256
    mask_prob: float = 0.15         # bert-mlm: share of tokens masked; bart-denoise: share text infilling hides
    masking: str = "token"          # bert-mlm: "token" (BERT) or "knowledge" (ERNIE 1.0's three levels)
    seed: int = 0

    def __post_init__(self):
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"recipe {self.name}: optimizer must be one of {sorted(OPTIMIZERS)}, got {self.optimizer!r}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"recipe {self.name}: schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        if self.masking not in ("token", "knowledge"):
            raise ValueError(f"recipe {self.name}: masking must be 'token' or 'knowledge', got {self.masking!r}")
        if self.masking == "knowledge" and self.kind != "bert-mlm":
            raise ValueError(f"recipe {self.name}: knowledge masking is for bert-mlm, not {self.kind}")
        if (self.unit == "pairs") != (self.kind in translation.PAIR_KINDS):
            raise ValueError(f"recipe {self.name}: a translation kind ({', '.join(sorted(translation.PAIR_KINDS))}) "
                             f"counts pairs (unit='pairs'), and only it does; got kind {self.kind} with unit {self.unit!r}")
        if self.unit == "pairs":
            if (self.tokenizer == "words") != (self.target_vocab_size is not None):
                raise ValueError(f"recipe {self.name}: a pair recipe reads words with a vocabulary for each side "
                                 "(tokenizer='words' and target_vocab_size), or subwords with one for both")
        elif (self.tokenizer == "words") != (self.kind == "elmo-bilm"):
            raise ValueError(f"recipe {self.name}: an elmo-bilm model reads words (tokenizer='words'), and only it does; "
                             f"got kind {self.kind} with tokenizer {self.tokenizer!r}")

    @property
    def tokens_per_step(self) -> int:
        """The budget's unit read per step: tokens of packed sequences, or pairs (``unit="pairs"``)."""
        return self.batch_size * (1 if self.unit == "pairs" else self.seq_len)

    @property
    def source_len(self) -> int:
        """bart-denoise: the encoder's input length (text infilling can add a [MASK] per empty span)."""
        return self.seq_len + 8

    def model_config(self, vocab_size: int) -> dict:
        if self.kind == "bert-mlm":
            return {**self.model, "vocab_size": vocab_size, "max_position": self.seq_len}
        if self.kind == "bart-denoise":
            return {**self.model, "vocab_size": vocab_size, "max_len": self.source_len}
        if self.kind == "elmo-bilm":
            return {**self.model, "vocab_size": vocab_size}
        if self.kind == "t5-span":              # T5's sentinels are the last ids, after the tokenizer's
            from lib.text import SPECIAL_IDS
            return {**self.model, "vocab_size": vocab_size + T5_SENTINELS, "pad_id": SPECIAL_IDS["pad"],
                    "eos_id": SPECIAL_IDS["eos"], "decoder_start_id": SPECIAL_IDS["pad"]}
        return {**self.model, "vocab_size": vocab_size, "block_size": self.seq_len}


# No dropout while pretraining: a run of one or two passes does not overfit, and on a CPU dropout's
# random masks cost about a fifth of the step (measured with the profiler). Fine-tuning asks for its
# own (lib.checkpoints.load(name, config=...) takes the caller's dropout rates).
_BERT_4x256 = dict(hidden_size=256, num_layers=4, num_heads=4, intermediate_size=1024, dropout=0.0,
                   attention_dropout=0.0)
RECIPES: dict[str, Recipe] = {r.name: r for r in [
    Recipe("ko-bert", "bert-mlm", "Korean BERT (4 layers x 256), masked LM only, on the NSMC crawl without any "
           "test review", corpus="nsmc", model=_BERT_4x256, heldout_sequences=512),
    # ERNIE 1.0's knowledge masking on ko-bert's corpus, tokenizer, model, seed and schedule: the twin
    # whose only difference from ko-bert is which tokens are hidden (chapter 13)
    Recipe("ernie-ko", "bert-mlm", "Korean ERNIE (4 layers x 256): ko-bert's twin with knowledge masking (tokens, "
           "phrases and entities in equal parts) on the NSMC crawl without any test review", corpus="nsmc",
           model=_BERT_4x256, heldout_sequences=512, masking="knowledge"),
    Recipe("gpt-imdb", "gpt-lm", "GPT-2-style decoder (4 layers x 256) on IMDB's training and unlabelled reviews, "
           "never a test review", corpus="imdb", model=dict(n_layer=4, n_head=4, n_embd=256, dropout=0.0),
           seq_len=128, batch_size=32, tokens=24_000_000, heldout_sequences=512),
    # BART's final noise (sentence permutation, then text infilling of 30 % in Poisson(3) spans) on
    # packed stretches of the NSMC crawl, the reviews in a stretch being its sentences (chapter 10)
    Recipe("bart-ko", "bart-denoise", "Korean BART (2 + 2 layers x 256), sentence permutation and text infilling "
           "on the NSMC crawl without any test review", corpus="nsmc",
           model=dict(d_model=256, num_heads=4, encoder_layers=2, decoder_layers=2, d_ff=1024, dropout=0.0),
           mask_prob=0.3, heldout_sequences=512),
    # ELMo's biLM (chapter 6): words read as UTF-8 bytes by a character CNN, a forward and a backward
    # LSTM language model over packed windows of words (each review between <S> and </S>), the softmax
    # over the most frequent words (the rest are read, never predicted). The softmax is adaptive: a full
    # one over 16,000 words was half of a CPU step (1.2 s; 0.78 s adaptive, measured with bfloat16 on
    # 2 threads), and the reviews hold 5.4M training words, so 12M words are about 2.2 passes
    Recipe("elmo-ko", "elmo-bilm", "Korean ELMo biLM (character CNN, 2 LSTM layers of 256 cells, projection 128) "
           "on the NSMC crawl without any test review", corpus="nsmc", tokenizer="words", vocab_size=16_000,
           model=dict(max_chars=24, char_dim=16, filters=((1, 32), (2, 32), (3, 64), (4, 64), (5, 96), (6, 96),
                                                         (7, 128)), highway=2, proj=128, hidden=256, lstm_layers=2,
                      dropout=0.0, softmax_cutoffs=(2000, 6000)),
           seq_len=32, batch_size=64, lr=2e-3, tokens=12_000_000, heldout_sequences=512),
    # T5's span corruption (15 % of the tokens in spans of mean length 3, each span one sentinel) on
    # packed 128-token stretches of chapter 11's three languages (t5-mix), the size of chapter 11's
    # full-recipe model: the chapter fine-tunes it on translation, sentiment and chat (chapter 11)
    Recipe("t5-mix", "t5-span", "T5 (2 + 2 layers x 128) with span corruption on Korean and English reviews, "
           "English and French Tatoeba sentences and the chatbot's texts, never a test item of chapter 11",
           corpus="t5-mix", model=dict(d_model=128, d_kv=32, d_ff=512, num_heads=4, num_layers=2, dropout=0.0),
           lowercase=True, seq_len=128, batch_size=64, optimizer="adafactor", lr=1e-2, weight_decay=0.0,
           tokens=40_000_000, heldout_sequences=512, mask_prob=0.15),
    # Chapter 1's two translators, English -> French: the same GRU encoder-decoder with one fixed context
    # vector or with Luong's dot attention, the same data order, budget and schedule. 6,000 steps of 64
    # pairs are three passes over the 128,463 training pairs (0.17 s a step on one CPU thread).
    *[Recipe(f"s2s-{arm}-fra-eng", "seq2seq", f"GRU encoder-decoder (128-d words, 256-d states) {what}, "
             "English -> French on the Tatoeba pairs whose English sentence is not held out (chapter 1)",
             corpus="tatoeba-fra-eng", tokenizer="words", vocab_size=5_000, target_vocab_size=6_000, lowercase=True,
             model=dict(emb_dim=128, hidden_dim=256, cell="gru", attention=arm == "attention"), unit="pairs",
             seq_len=25, batch_size=64, lr=2e-3, weight_decay=0.0, clip_grad=1.0, tokens=384_000,
             eval_every_tokens=32_000, log_every_tokens=3_200, heldout_sequences=2_048)
      for arm, what in (("fixed", "with one fixed context vector"), ("attention", "with dot-product (Luong) attention"))],
    # Chapter 3's Transformer translator: chapter 1's data, vocabularies, batches, budget and schedule shape
    # (its attention RNN is s2s-attention-fra-eng), the Transformer paper's Adam and label smoothing 0.1
    Recipe("transformer-fra-eng", "transformer", "Transformer encoder-decoder (2 + 2 layers x 128, 4 heads, output "
           "layer tied to the target embeddings), English -> French on the Tatoeba pairs whose English sentence is "
           "not held out (chapter 3)", corpus="tatoeba-fra-eng", tokenizer="words", vocab_size=5_000,
           target_vocab_size=6_000, lowercase=True,
           model=dict(d_model=128, num_heads=4, num_encoder_layers=2, num_decoder_layers=2, d_ff=512, dropout=0.1,
                      max_len=58, tie_output=True), unit="pairs", seq_len=25, batch_size=64,
           optimizer="adam-transformer", lr=2e-3, weight_decay=0.0, clip_grad=1.0, label_smoothing=0.1,
           tokens=384_000, eval_every_tokens=32_000, log_every_tokens=3_200, heldout_sequences=2_048),
    # Chapter 4's chatbot, the seed's recipe: post-LN 2 + 2 layers x 256 with 8 heads, separate embeddings,
    # label smoothing 0.1, the paper's schedule with 4,000 warm-up steps, 50 passes over the training pairs
    # (8,800 steps of 64)
    Recipe("chatbot-ko", "transformer", "Transformer chatbot (2 + 2 layers x 256, 8 heads, post-LN) on the Korean "
           "chatbot pairs whose question is not held out (chapter 4)", corpus="chatbot-ko", tokenizer="bpe",
           vocab_size=8_192, model=dict(d_model=256, num_heads=8, num_encoder_layers=2, num_decoder_layers=2,
                                         d_ff=512, dropout=0.1, max_len=64, norm_first=False, share_embeddings=False),
           unit="pairs", seq_len=40, batch_size=64, optimizer="adam-transformer", lr=1.0, weight_decay=0.0,
           schedule="inverse-sqrt", warmup=4_000 / 8_800, label_smoothing=0.1, tokens=8_800 * 64,
           eval_every_tokens=880 * 64, log_every_tokens=88 * 64, heldout_sequences=1_000),
    # for the tests: the same code on 3,000 rows of the crawl, a model of a few thousand parameters
    Recipe("ko-bert-tiny", "bert-mlm", "test recipe: ko-bert's code at toy size", corpus="nsmc-first-3000",
           model=dict(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64), vocab_size=400,
           seq_len=32, batch_size=8, tokens=8 * 32 * 12, eval_every_tokens=8 * 32 * 4, log_every_tokens=8 * 32,
           heldout_every=10, heldout_sequences=16),
    Recipe("ernie-ko-tiny", "bert-mlm", "test recipe: ernie-ko's code at toy size", corpus="nsmc-first-3000",
           model=dict(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64), vocab_size=400,
           seq_len=32, batch_size=8, tokens=8 * 32 * 12, eval_every_tokens=8 * 32 * 4, log_every_tokens=8 * 32,
           heldout_every=10, heldout_sequences=16, masking="knowledge"),
    Recipe("bart-ko-tiny", "bart-denoise", "test recipe: bart-ko's code at toy size", corpus="nsmc-first-3000",
           model=dict(d_model=32, num_heads=2, encoder_layers=1, decoder_layers=1, d_ff=64), vocab_size=400,
           seq_len=32, batch_size=8, tokens=8 * 32 * 12, eval_every_tokens=8 * 32 * 4, log_every_tokens=8 * 32,
           heldout_every=10, heldout_sequences=16, mask_prob=0.3),
    Recipe("elmo-ko-tiny", "elmo-bilm", "test recipe: elmo-ko's code at toy size", corpus="nsmc-first-3000",
           tokenizer="words", vocab_size=200, model=dict(max_chars=16, char_dim=4, filters=((1, 4), (2, 4)), highway=1,
                                                         proj=8, hidden=16, lstm_layers=1, dropout=0.0,
                                                         softmax_cutoffs=(40,)),
           seq_len=16, batch_size=8, tokens=8 * 16 * 12, eval_every_tokens=8 * 16 * 4, log_every_tokens=8 * 16,
           heldout_every=10, heldout_sequences=16),
    Recipe("t5-mix-tiny", "t5-span", "test recipe: t5-mix's code at toy size", corpus="nsmc-first-3000",
           model=dict(d_model=16, d_kv=8, d_ff=32, num_heads=2, num_layers=1, dropout=0.0), vocab_size=400,
           lowercase=True, seq_len=32, batch_size=8, optimizer="adafactor", lr=1e-2, weight_decay=0.0,
           tokens=8 * 32 * 12, eval_every_tokens=8 * 32 * 4, log_every_tokens=8 * 32, heldout_every=10,
           heldout_sequences=16, mask_prob=0.15),
    Recipe("s2s-attention-tiny", "seq2seq", "test recipe: the translators' code at toy size", corpus="tatoeba-fra-eng",
           tokenizer="words", vocab_size=200, target_vocab_size=200, lowercase=True,
           model=dict(emb_dim=8, hidden_dim=16, cell="gru", attention=True), unit="pairs", seq_len=25, batch_size=8,
           weight_decay=0.0, clip_grad=1.0, tokens=8 * 12, eval_every_tokens=8 * 4, log_every_tokens=8,
           heldout_sequences=16),
    Recipe("chatbot-ko-tiny", "transformer", "test recipe: the chatbot's code at toy size", corpus="chatbot-ko",
           tokenizer="bpe", vocab_size=300, model=dict(d_model=16, num_heads=2, num_encoder_layers=1,
                                                      num_decoder_layers=1, d_ff=32, dropout=0.1),
           unit="pairs", seq_len=40, batch_size=8, optimizer="adam-transformer", lr=1.0, weight_decay=0.0,
           schedule="inverse-sqrt", warmup=0.5, label_smoothing=0.1, tokens=8 * 12, eval_every_tokens=8 * 4,
           log_every_tokens=8, heldout_sequences=16),
    Recipe("gpt-imdb-tiny", "gpt-lm", "test recipe: gpt-imdb's code at toy size", corpus="nsmc-first-3000",
           model=dict(n_layer=2, n_head=2, n_embd=32, dropout=0.1), vocab_size=400, seq_len=32, batch_size=8,
           tokens=8 * 32 * 12, eval_every_tokens=8 * 32 * 4, log_every_tokens=8 * 32, heldout_every=10,
           heldout_sequences=16),
]}


def with_overrides(recipe: Recipe, sets: list[str]) -> Recipe:
    """``--set key=value`` (a recipe field) or ``--set model.key=value`` (a model field); values are JSON."""
    changes: dict[str, Any] = {}
    model = dict(recipe.model)
    for item in sets:
        key, sep, raw = item.partition("=")
        if not sep:
            raise SystemExit(f"--set {item!r}: expected KEY=VALUE")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        if key.startswith("model."):
            model[key[len("model."):]] = value
        elif key in {f.name for f in dataclasses.fields(Recipe)} - {"name", "kind", "model"}:
            changes[key] = value
        else:
            raise SystemExit(f"--set {key}: not a recipe field (fields: "
                             f"{', '.join(f.name for f in dataclasses.fields(Recipe))}, model.<field>)")
    return dataclasses.replace(recipe, model=model, **changes)


def parse_tokens(value: str) -> int:
    """``36M``, ``500k``, ``2.5M`` or ``12000`` -> a number of tokens."""
    text = value.strip().upper()
    scale = {"K": 1_000, "M": 1_000_000, "G": 1_000_000_000}.get(text[-1:], 1)
    number = text[:-1] if scale > 1 else text
    try:
        tokens = int(round(float(number) * scale))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a token count (e.g. 36M, 500k, 12000)") from None
    if tokens < 1:
        raise argparse.ArgumentTypeError(f"{value!r}: a token count must be positive")
    return tokens


def token_label(tokens: int) -> str:
    for unit, scale in (("M", 1_000_000), ("k", 1_000)):
        if tokens >= scale and tokens % (scale // 10) == 0:
            return f"{tokens / scale:g}{unit}"
    return str(tokens)


# ----------------------------------------------------------------------------- data

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
    if recipe.unit == "pairs":
        meta = translation.prepare(recipe, folder, _data_fingerprint(recipe))
        with atomic_write(meta_file, "w", encoding="utf-8") as f:
            json.dump(meta, f, indent=1, ensure_ascii=False)
        return meta
    from lib import data
    from lib.text import train_tokenizer

    start = time.perf_counter()
    fn, files = CORPORA[recipe.corpus]
    texts, counts = fn()
    heldout = [t for i, t in enumerate(texts) if i % recipe.heldout_every == 0]
    training = [t for i, t in enumerate(texts) if i % recipe.heldout_every != 0]
    if recipe.tokenizer == "words":
        streams, tok = word_streams(training, heldout, recipe.vocab_size, recipe.model["max_chars"])
    else:
        tok = train_tokenizer(training, kind=recipe.tokenizer, vocab_size=recipe.vocab_size,
                              lowercase=recipe.lowercase)
        sep = tok.sep_id if recipe.kind == "bert-mlm" else tok.eos_id     # between documents

        def stream(docs: list[str]) -> torch.Tensor:
            ids = [i for seq in tok.encode_batch(docs) for i in (*seq, sep)]
            return torch.tensor(ids, dtype=torch.int16 if tok.vocab_size < 2 ** 15 else torch.int32)

        streams = {"train": stream(training), "heldout": stream(heldout)}
    if recipe.masking == "knowledge":
        for part, docs in (("train", training), ("heldout", heldout)):
            for level, units in unit_streams(docs, tok).items():
                if len(units) != len(streams[part]):
                    raise RuntimeError(f"the {level} units of the {part} documents have {len(units):,} entries "
                                       f"for {len(streams[part]):,} tokens: the tokenizer and Kiwi disagree")
                streams[f"{part}_{level}"] = units
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


#: kinds whose model reads an input with an encoder: their evaluation also scores each held-out target
#: after another example's input (``heldout_loss(..., other_input=True)``), so that a run shows whether
#: the decoder uses the input at all (chapter 11: a T5 can earn most of span corruption's loss without)
ENCODER_DECODER_KINDS = frozenset({"t5-span", "bart-denoise"})


@torch.no_grad()
def heldout_loss(model, batches: list, kind: str, other_input: bool = False) -> float:
    """Mean loss per predicted token over the fixed held-out batches (float32, eval mode). With
    ``other_input`` (encoder-decoder kinds), each target is scored after the input of the batch's next
    example (the inputs rolled by one)."""
    if kind in translation.PAIR_KINDS:
        if other_input:
            raise ValueError(f"other_input is not measured for {kind}")
        return translation.heldout_loss(model, batches)
    was = model.training
    model.eval()
    total = count = 0.0
    where = next(model.parameters()).device
    for batch in batches:
        x, *rest, y = (t.to(where) for t in batch)
        if other_input:
            if kind not in ENCODER_DECODER_KINDS or len(x) < 2:
                raise ValueError(f"other_input needs an encoder-decoder kind and batches of two or more, got {kind}")
            x = x.roll(1, 0)
        if kind == "elmo-bilm":          # both directions' predictions, each weighted by its count
            _, (loss_f, loss_b) = model.lm_loss(x, *rest, y)
            n_f, n_b = (y[:, 1:] != mlm.IGNORE_INDEX).sum().item(), (y[:, :-1] != mlm.IGNORE_INDEX).sum().item()
            total += loss_f.item() * n_f + loss_b.item() * n_b
            count += n_f + n_b
            continue
        if kind == "bert-mlm":
            logits, targets = masked_logits(model, x, y != mlm.IGNORE_INDEX), y[y != mlm.IGNORE_INDEX]
        elif kind == "t5-span":
            logits, targets = model(x, labels=y)[0].flatten(0, 1), y.flatten()
        elif kind == "bart-denoise":
            logits, targets = model(x, *rest)[y != mlm.IGNORE_INDEX], y[y != mlm.IGNORE_INDEX]
        else:
            logits, targets = model(x)[0].flatten(0, 1), y.flatten()
        total += F.cross_entropy(logits.float(), targets, reduction="sum").item()
        count += targets.numel()
    model.train(was)
    return total / count


def rounded_losses(model, batches: list, kind: str) -> dict[str, float]:
    """The held-out loss with the weights as stored in each dtype (rounded, then computed in float32)."""
    out = {}
    for name, dtype in DTYPES.items():
        twin = copy.deepcopy(model)
        with torch.no_grad():
            for p in list(twin.parameters()) + list(twin.buffers()):
                if p.is_floating_point():
                    p.copy_(p.to(dtype).float())
        out[name] = heldout_loss(twin, batches, kind)
    return out


def storage_dtype(losses: dict[str, float]) -> str:
    """float16, else bfloat16, when its held-out loss is within DTYPE_TOLERANCE of float32's; else float32."""
    for name in ("float16", "bfloat16"):
        if abs(losses[name] - losses["float32"]) <= DTYPE_TOLERANCE:
            return name
    return "float32"


# ----------------------------------------------------------------------------- the run

def build_training(recipe: Recipe, data_folder: Path) -> tuple:
    """From the prepared data: (tokenizer, the training loader, the fixed held-out batches, the model
    initialised from the recipe's seed)."""
    if recipe.unit == "pairs":
        return translation.build_training(recipe, data_folder)
    from lib.text import SubwordTokenizer, WordVocab
    tok = (WordVocab if recipe.tokenizer == "words" else SubwordTokenizer).load(data_folder / "tokenizer.json")
    streams = torch.load(data_folder / "streams.pt", weights_only=True)
    dataset = make_dataset(recipe, streams, "train", tok, recipe.seed)
    held = make_dataset(recipe, streams, "heldout", tok, recipe.seed + 1)
    held_items = [held[i] for i in range(min(recipe.heldout_sequences, len(held)))]
    heldout = [tuple(torch.stack(t) for t in zip(*held_items[i:i + 64])) for i in range(0, len(held_items), 64)]
    sampler = train.GlobalBatchSampler(len(dataset), recipe.batch_size, recipe.seed, tag_epoch=True)
    loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler)
    torch.manual_seed(recipe.seed)
    model = checkpoints.build_model(recipe.kind, recipe.model_config(tok.vocab_size))
    return tok, loader, heldout, model


@dataclass
class Run:
    """A run's fixed settings (``run.json`` in the scratch folder) and where its files go."""
    recipe: Recipe
    tokens: int
    snapshots: list[int]
    scratch: Path
    out: Path
    command: str
    dev: torch.device = torch.device("cpu")
    provenance: dict | None = None  # git_commit() when the command started (the code that runs)
    steps: int = field(init=False)

    def __post_init__(self):
        self.steps = math.ceil(self.tokens / self.recipe.tokens_per_step)

    @property
    def settings(self) -> dict:
        return {"recipe": dataclasses.asdict(self.recipe), "tokens": self.tokens, "snapshots": self.snapshots,
                "steps": self.steps}

    def snapshot_steps(self) -> dict[int, int]:
        return {math.ceil(t / self.recipe.tokens_per_step): t for t in self.snapshots if t < self.tokens}

    def boundaries(self, eval_every: int) -> list[int]:
        return sorted(set(range(eval_every, self.steps, eval_every)) | set(self.snapshot_steps()) | {self.steps})


def canonical_command(recipe_name: str, tokens: int, snapshots: list[int], sets: list[str]) -> str:
    parts = ["python", "-m", "tools.pretrain", recipe_name, "--tokens", token_label(tokens)]
    if snapshots:
        parts += ["--snapshots", ",".join(token_label(t) for t in snapshots)]
    for s in sets:
        parts += ["--set", s]
    return shlex.join(parts)


def _barrier() -> None:
    if device.world_size() > 1:
        torch.distributed.barrier()


def _agree(flag: bool) -> bool:
    """Rank 0's answer, in every process (so that all stop together)."""
    if device.world_size() == 1:
        return flag
    t = torch.tensor([int(flag)])
    torch.distributed.broadcast(t, src=0)
    return bool(t.item())


def _fmt_time(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


def _read_json(file: Path, default):
    return json.loads(file.read_text()) if file.is_file() else default


def _write_json(file: Path, payload) -> None:
    with atomic_write(file, "w", encoding="utf-8") as f:
        json.dump(payload, f, indent=1, ensure_ascii=False)
        f.write("\n")


def train_run(run: Run, minutes: float | None, say: Callable[[str], None] = print) -> dict | None:
    """Train (resuming from the scratch checkpoint) until the schedule ends or ``minutes`` are spent.
    Returns the final state (model, history, ...) when the schedule ended, None when stopped early."""
    recipe = run.recipe
    rank, world = device.rank(), device.world_size()
    dev = run.dev
    state_file, clock_file = run.scratch / "state.pt", run.scratch / "clock.json"
    if rank == 0:
        saved = _read_json(run.scratch / "run.json", None)
        if saved is not None and saved != run.settings:
            diff = [k for k in run.settings if saved.get(k) != run.settings[k]]
            raise SystemExit(f"{run.scratch} holds a run with other settings ({', '.join(diff)} differ): run the "
                             "same command to resume it, or add --fresh to start over")
        run.scratch.mkdir(parents=True, exist_ok=True)
        _write_json(run.scratch / "run.json", run.settings)
        meta = prepare(recipe, run.scratch / "data")
    _barrier()
    meta = json.loads((run.scratch / "data" / "data.json").read_text())
    tok, loader, heldout, model = build_training(recipe, run.scratch / "data")
    optimizer = OPTIMIZERS[recipe.optimizer](model.parameters(), recipe.lr, recipe.weight_decay)
    warmup = max(1, round(recipe.warmup * run.steps))
    scheduler = (train.warmup_cosine(optimizer, warmup_steps=warmup, total_steps=max(run.steps, 2),
                                     min_ratio=recipe.min_lr_ratio) if recipe.schedule == "cosine" else
                 train.transformer_schedule(optimizer, d_model=model.cfg.d_model, warmup_steps=warmup))
    eval_every = max(1, round(recipe.eval_every_tokens / recipe.tokens_per_step))
    log_every = max(1, round(recipe.log_every_tokens / recipe.tokens_per_step))
    done = read_checkpoint(state_file)["step"] if state_file.is_file() else 0
    if done:
        say(f"resuming {recipe.name} from {state_file} at step {done:,} ({done * recipe.tokens_per_step:,} tokens)")
    clock = _read_json(clock_file, {"seconds": 0.0, "invocations": []})
    clock["invocations"].append({"started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                                 "from_step": done, "to_step": done, "seconds": 0.0,
                                 "device": device.summary(dev, recipe=False), "world_size": world,
                                 **(run.provenance or git_commit())})
    started = time.perf_counter()
    snapshot_steps = run.snapshot_steps()
    history = None
    step_fn = translation.step_fn(recipe) if recipe.unit == "pairs" else STEP_FNS[recipe.kind]

    def evaluate(m):
        out = {"loss": heldout_loss(m, heldout, recipe.kind)}
        if recipe.kind in ENCODER_DECODER_KINDS:     # does the decoder read its input? (lower is: yes)
            out["loss_other_input"] = heldout_loss(m, heldout, recipe.kind, other_input=True)
        return out

    if done in snapshot_steps and rank == 0 and f"{recipe.name}@{token_label(snapshot_steps[done])}" not in \
            checkpoints.registry(run.out):    # stopped between the checkpoint and the snapshot: write it now
        train.load_checkpoint(state_file, model)
        write_snapshot(run, model, heldout, done, snapshot_steps[done], meta, say)
    for boundary in run.boundaries(eval_every):
        if boundary <= done:
            continue
        chunk_start = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):    # fit's "resumed from ..." line, once per chunk
            history = train.fit(model, loader, optimizer=optimizer, scheduler=scheduler, step_fn=step_fn,
                                epochs=None, max_steps=boundary, eval_fn=evaluate, eval_every=eval_every, device=dev,
                                clip_grad=recipe.clip_grad,
                                checkpoint=state_file, resume=True, progress=False, log_every=log_every,
                                seed=recipe.seed)
        seconds = time.perf_counter() - chunk_start
        if rank == 0:
            clock["seconds"] += seconds
            clock["invocations"][-1].update(to_step=boundary, seconds=round(time.perf_counter() - started, 1))
            _write_json(clock_file, clock)
        rate = (boundary - done) * recipe.tokens_per_step / seconds
        last = next(r for r in reversed(history.records) if "eval_loss" in r)
        eta = (run.steps - boundary) * recipe.tokens_per_step / rate
        say(f"{recipe.name} step {boundary:,}/{run.steps:,} | {recipe.unit} {token_label(boundary * recipe.tokens_per_step)}"
            f"/{token_label(run.tokens)} | train {last.get('train_loss', float('nan')):.3f} | held-out "
            f"{last.get('eval_loss', float('nan')):.3f}"
            + (f" (after another input {last['eval_loss_other_input']:.3f})" if "eval_loss_other_input" in last else "")
            + f" | {rate:,.0f} {recipe.unit}/s | {_fmt_time(clock['seconds'])} "
            f"trained, about {_fmt_time(eta)} to go")
        done = boundary
        if boundary in snapshot_steps and rank == 0:
            write_snapshot(run, model, heldout, boundary, snapshot_steps[boundary], meta, say)
        _barrier()
        if _agree(minutes is not None and time.perf_counter() - started >= minutes * 60) and done < run.steps:
            say(f"stopped after {minutes:g} minutes at step {done:,} of {run.steps:,} (checkpoint {state_file}): "
                "run the same command again to continue from there")
            return None
    if history is None:          # the schedule had ended before this invocation: the model it left
        history = train.load_checkpoint(state_file, model)["history"]
        if history.records[-1].get("step") != run.steps or "eval_loss" not in history.records[-1]:
            history.records.append({"step": run.steps, **{f"eval_{k}": v for k, v in evaluate(model).items()}})
    return {"model": model, "history": history, "heldout": heldout, "meta": meta, "clock": clock,
            "tokenizer": tok, "eval_every": eval_every}


# ----------------------------------------------------------------------------- the output

def _copy_tokenizer(run: Run) -> str:
    relative = f"{run.recipe.name}/tokenizer.json"
    src, dst = run.scratch / "data" / "tokenizer.json", run.out / relative
    if not dst.is_file() or file_sha256(dst) != file_sha256(src):
        with atomic_write(dst, "wb") as f:
            f.write(src.read_bytes())
    return relative


def _tokenizer_files(run: Run) -> dict:
    """The registry entries of a checkpoint's vocabularies: its tokenizer, and a translation model's target side."""
    files = {"tokenizer": checkpoints.file_entry(run.out, _copy_tokenizer(run))}
    target = translation.copy_target_tokenizer(run.scratch / "data", run.out, run.recipe.name)
    if target:
        files["target_tokenizer"] = checkpoints.file_entry(run.out, target)
    return files


def _weights_metadata(run: Run, model, tokens: int, step: int, losses: dict, dtype: str) -> dict:
    return {"name": run.recipe.name, "kind": run.recipe.kind, "config": checkpoints.config_dict(model.cfg),
            "tokens_seen": tokens, "steps": step, "heldout_loss": losses, "stored_dtype": dtype}


def check_budget(run: Run, model, dtype: str, extra: int = 100_000) -> None:
    """Refuse before writing anything when the output would break the folder's size budget."""
    if run.out != checkpoints.CHECKPOINT_DIR.resolve():
        return
    others = {k: v for k, v in checkpoints.registry(run.out).items() if k.split("@")[0] != run.recipe.name}
    state, _ = checkpoints.weights_state(model)
    weights = sum(t.numel() * (DTYPES[dtype].itemsize if t.is_floating_point() else t.element_size())
                  for t in state.values())
    planned = checkpoints.total_size(others) + weights * (1 + len(run.snapshot_steps())) + extra
    if planned > checkpoints.BUDGET_BYTES:
        raise SystemExit(f"{run.recipe.name} would bring {run.out} to about {planned / 1e6:.0f} MB, over its budget "
                         f"of {checkpoints.BUDGET_BYTES / 1e6:.0f} MB: fewer snapshots, or --out elsewhere")


def write_snapshot(run: Run, model, heldout, step: int, tokens: int, meta: dict, say) -> None:
    losses = rounded_losses(model, heldout, run.recipe.kind)
    dtype = storage_dtype(losses)
    check_budget(run, model, dtype)
    name = f"{run.recipe.name}@{token_label(tokens)}"
    relative = f"{run.recipe.name}/snapshots/{run.recipe.name}-{token_label(tokens)}.safetensors"
    checkpoints.save_weights(model, run.out / relative, DTYPES[dtype],
                             _weights_metadata(run, model, step * run.recipe.tokens_per_step, step, losses, dtype))
    files = {"weights": checkpoints.file_entry(run.out, relative), **_tokenizer_files(run)}
    checkpoints.register(checkpoints.CheckpointInfo(
        name=name, kind=run.recipe.kind, config=checkpoints.config_dict(model.cfg), files=files,
        command=run.command, description=f"{run.recipe.description}: snapshot after {token_label(tokens)} tokens"),
        run.out)
    say(f"snapshot {name}: {run.out / relative} ({dtype}, held-out loss {losses['float32']:.4f})")


def git_commit() -> dict:
    """The commit the code runs from, and whether tracked code has uncommitted changes (besides the
    results and the checkpoints, which runs write themselves: a snapshot registered by this run is not
    a change to the code that trains it)."""
    from lib.results import _provenance
    commit, dirty = _provenance(exclude=("results", "checkpoints"))
    return {"commit": commit, "uncommitted_changes": dirty}


def code_version(invocations: list[dict]) -> dict:
    """The code a run trained with, from its invocations (each records the commit it started from):
    ``commit`` the first one's, ``uncommitted_changes`` whether any had changes, and ``commits`` every
    commit when the invocations ran from different ones."""
    commits = list(dict.fromkeys(i["commit"] for i in invocations))
    out = {"commit": commits[0], "uncommitted_changes": any(i["uncommitted_changes"] for i in invocations)}
    return {**out, "commits": commits} if len(commits) > 1 else out


def write_output(run: Run, result: dict, say: Callable[[str], None] = print) -> dict:
    """Weights, tokenizer, card (JSON and Markdown), then the registry entry; returns the card."""
    recipe, model, meta = run.recipe, result["model"], result["meta"]
    folder = run.out / recipe.name
    losses = rounded_losses(model, result["heldout"], recipe.kind)
    dtype = storage_dtype(losses)
    tokens_seen = run.steps * recipe.tokens_per_step
    check_budget(run, model, dtype)
    weights = f"{recipe.name}/model.safetensors"
    checkpoints.save_weights(model, run.out / weights, DTYPES[dtype],
                             _weights_metadata(run, model, tokens_seen, run.steps, losses, dtype))
    records = result["history"].records
    curve = [{"step": r["step"], "tokens": r["step"] * recipe.tokens_per_step,
              "train_loss": round(r["train_loss"], 4) if "train_loss" in r else None,
              "heldout_loss": round(r["eval_loss"], 4),
              **({"heldout_loss_other_input": round(r["eval_loss_other_input"], 4)}
                 if "eval_loss_other_input" in r else {})} for r in records if "eval_loss" in r]
    clock = result["clock"]
    card = {
        "name": recipe.name, "description": recipe.description, "kind": recipe.kind,
        "command": run.command, **code_version(clock["invocations"]),
        "data": {"datasets": meta["datasets"], "corpus": recipe.corpus, "corpus_sha256": meta["corpus_sha256"],
                 "documents": meta["documents"], "heldout_documents": meta["heldout_documents"],
                 "train_tokens": meta["train_tokens"], "heldout_tokens": meta["heldout_tokens"],
                 "counts": meta["counts"], "passes": round(tokens_seen / meta["train_tokens"], 3)},
        "tokenizer": {"kind": recipe.tokenizer, "vocab_size": meta["vocab_size"], "lowercase": recipe.lowercase,
                      "file": "tokenizer.json", "sha256": meta["tokenizer_sha256"],
                      **({"target_vocab_size": meta["target_vocab_size"], "target_file": translation.TARGET_TOKENIZER,
                          "target_sha256": meta["target_tokenizer_sha256"]} if "target_vocab_size" in meta else {})},
        "model": {"config": checkpoints.config_dict(model.cfg), "parameters": model.num_parameters()},
        "training": {"tokens_seen": tokens_seen, "tokens_target": run.tokens, "unit": recipe.unit, "steps": run.steps,
                     "global_batch": recipe.batch_size, "seq_len": recipe.seq_len,
                     "optimizer": recipe.optimizer, "lr": recipe.lr,
                     "schedule": (f"linear warm-up over {recipe.warmup:.0%} of the steps, cosine to "
                                  f"{recipe.min_lr_ratio:g} x lr" if recipe.schedule == "cosine" else
                                  f"the Transformer's: warm-up over {recipe.warmup:.0%} of the steps, then 1/sqrt(step), "
                                  f"x d_model^-0.5 x {recipe.lr:g}"),
                     "label_smoothing": recipe.label_smoothing, "weight_decay": recipe.weight_decay,
                     "wall_seconds": round(clock["seconds"], 1), "prepare_seconds": meta["seconds"],
                     "invocations": clock["invocations"],
                     "device": clock["invocations"][-1]["device"], "precision": device.precision(run.dev, model).name,
                     "recipe": dataclasses.asdict(recipe)},
        "heldout": {"loss": losses["float32"], "by_stored_dtype": losses, "stored_dtype": dtype,
                    "tolerance_nats": DTYPE_TOLERANCE, "curve": curve},
        "snapshots": [f"{recipe.name}@{token_label(t)}" for t in run.snapshots if t < run.tokens],
    }
    _write_json(folder / "card.json", card)
    with atomic_write(folder / "card.md", "w", encoding="utf-8") as f:
        f.write(card_markdown(card))
    files = {"weights": checkpoints.file_entry(run.out, weights), **_tokenizer_files(run),
             "card": checkpoints.file_entry(run.out, f"{recipe.name}/card.json"),
             "card_md": checkpoints.file_entry(run.out, f"{recipe.name}/card.md")}
    checkpoints.register(checkpoints.CheckpointInfo(name=recipe.name, kind=recipe.kind,
                                                    config=checkpoints.config_dict(model.cfg), files=files,
                                                    command=run.command, description=recipe.description), run.out)
    say(f"wrote {folder}: {dtype} weights ({files['weights'].size / 1e6:.1f} MB), held-out loss "
        f"{losses['float32']:.4f} (float32) / {losses[dtype]:.4f} ({dtype}); registered in {run.out / 'registry.json'}")
    return card


def counts_text(counts: dict) -> str:
    """A corpus's counts in words: ``documents 5,410, nsmc (rows 712,404, ...)``, nested ones in brackets."""
    return ", ".join(f"{k.replace('_', ' ')} ({counts_text(v)})" if isinstance(v, dict) else f"{k.replace('_', ' ')} {v:,}"
                     for k, v in counts.items())


def card_markdown(card: dict) -> str:
    t, h, d = card["training"], card["heldout"], card["data"]
    unit = t.get("unit", "tokens")          # what the budget counts: tokens, or pairs for a translation model
    per_step = f"{t['global_batch']} pairs" if unit == "pairs" else f"{t['global_batch']} x {t['seq_len']} tokens"
    vocab = (f"words, {card['tokenizer']['vocab_size']:,} English and {card['tokenizer']['target_vocab_size']:,} "
             f"French entries (`tokenizer.json` and `{card['tokenizer']['target_file']}`, shipped with the weights)"
             if "target_vocab_size" in card["tokenizer"] else
             f"{card['tokenizer']['kind']}, {card['tokenizer']['vocab_size']:,} entries (`tokenizer.json`, shipped "
             "with the weights)")
    files = ", ".join(f"`{x['dataset']}/{x['file']}` (sha256 `{x['sha256'][:12]}…`)" for x in d["datasets"])
    lines = [f"# {card['name']}", "", card["description"] + ".", "",
             f"- **Model**: {card['kind']}, {card['model']['parameters']:,} parameters; configuration in `card.json`.",
             f"- **Data**: {files}; corpus `{d['corpus']}`: {d['documents']:,} documents (sha256 of the text "
             f"`{d['corpus_sha256'][:12]}…`), {d['train_tokens']:,} training {unit}, "
             + (f"every {t['recipe']['heldout_every']}th document held out" if unit == "tokens" else
                "the pairs of every held-out English sentence held out (lib.translation.is_held_out)")
             + f" ({d['heldout_tokens']:,} {unit}). Counts: " + counts_text(d["counts"]) + ".",
             f"- **Tokenizer**: {vocab}.",
             f"- **Training**: {t['tokens_seen']:,} {unit} ({d['passes']:g} passes), {t['steps']:,} steps of "
             f"{per_step}, {t.get('optimizer', 'adamw')} at lr {t['lr']:g} "
             f"({t['schedule']}), "
             f"{t['wall_seconds'] / 60:.1f} minutes of training in {len(t['invocations'])} invocation(s).",
             f"- **Device**: {t['device']}; precision {t['precision']} (training), weights stored in "
             f"{h['stored_dtype']}.",
             f"- **Held-out loss**: {h['loss']:.4f} nats/{'token' if unit == 'tokens' else 'target word'} in float32; "
             "with the stored weights "
             + ", ".join(f"{k} {v:.4f}" for k, v in h["by_stored_dtype"].items())
             + f" (a dtype is used when within {h['tolerance_nats']:g} nats).",
             "- **Commit**: " + ", ".join(f"`{c}`" for c in card.get("commits", [card["commit"]]))
             + (" (with uncommitted changes)" if card["uncommitted_changes"] else ""),
             f"- **Rebuild**: `{card['command']}`", ""]
    # encoder-decoder kinds: the held-out targets also after another example's input (does it read it?)
    other = bool(h["curve"]) and all("heldout_loss_other_input" in c for c in h["curve"])
    lines += [f"| step | {unit} | train loss | held-out loss |" + (" after another input |" if other else ""),
              "|---:|---:|---:|---:|" + ("---:|" if other else "")]
    lines += [f"| {c['step']:,} | {c['tokens']:,} | {c['train_loss'] if c['train_loss'] is not None else '—'} | "
              f"{c['heldout_loss']} |" + (f" {c['heldout_loss_other_input']} |" if other else "") for c in h["curve"]]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- command line

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m tools.pretrain", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("recipe", nargs="?", help="a recipe name (--list shows them)")
    ap.add_argument("--list", action="store_true", help="list the recipes and exit")
    ap.add_argument("--tokens", type=parse_tokens, help="length of the schedule in tokens (default: the recipe's)")
    ap.add_argument("--minutes", type=float, help="stop this invocation after this much wall time (resumable)")
    ap.add_argument("--snapshots", default="", help="token counts at which to save weights too, e.g. 2M,6M,15M")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a recipe field (or model.<field>), e.g. --set lr=5e-4")
    ap.add_argument("--out", type=Path, default=checkpoints.CHECKPOINT_DIR,
                    help="where the checkpoint goes (default: the repository's checkpoints/)")
    ap.add_argument("--scratch", type=Path, default=SCRATCH, help="resume state and prepared data (default .pretrain/)")
    ap.add_argument("--fresh", action="store_true",
                    help="delete this recipe's resume state and start over (the prepared data is kept)")
    ap.add_argument("--threads", type=int, help="CPU threads per process (default: lib.device's policy)")
    ap.add_argument("--precision", choices=("auto", "fp32", "bf16"),
                    help="training precision (sets COURSE_PRECISION; default: lib.device's policy)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> dict | None:
    args = parse_args(argv)
    if args.list or not args.recipe:
        for r in RECIPES.values():
            print(f"{r.name:22s} {r.kind:12s} {token_label(r.tokens):>5s} {r.unit:6s}  {r.description}")
        return None
    if args.recipe not in RECIPES:
        raise SystemExit(f"unknown recipe {args.recipe!r}: expected one of {', '.join(RECIPES)}")
    if args.precision:
        os.environ[device.PRECISION_ENV] = args.precision
    recipe = with_overrides(RECIPES[args.recipe], args.set)
    tokens = args.tokens or recipe.tokens
    snapshots = sorted(parse_tokens(s) for s in args.snapshots.split(",") if s.strip())
    scratch, out = args.scratch.resolve() / recipe.name, args.out.resolve()
    if out == scratch or out in scratch.parents or scratch in out.parents:
        raise SystemExit(f"--out {out} and --scratch {scratch} must be separate folders (optimizer state never "
                         "goes into the output)")
    dev = device.setup(seed=recipe.seed, cpu_threads=args.threads)
    main_process = device.is_main_process()
    say = print if main_process else (lambda line: None)
    if args.fresh and main_process:           # the prepared data (checked against the recipe) is kept
        for name in ("state.pt", "run.json", "clock.json"):
            (scratch / name).unlink(missing_ok=True)
    _barrier()
    run = Run(recipe, tokens, snapshots, scratch, out, canonical_command(recipe.name, tokens, snapshots, args.set), dev,
              provenance=git_commit())
    per_step = f"{recipe.batch_size} pairs" if recipe.unit == "pairs" else f"{recipe.batch_size} x {recipe.seq_len} tokens"
    say(f"{recipe.name}: {run.steps:,} steps of {per_step} = {token_label(run.steps * recipe.tokens_per_step)} "
        f"{recipe.unit} | {device.summary(dev)}")
    result = train_run(run, args.minutes, say)
    card = None
    if result is not None and main_process:
        card = write_output(run, result, say)
    _barrier()
    return {"card": card, **(result or {})}


if __name__ == "__main__":
    main()
