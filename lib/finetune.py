"""Text classification with few labels: fine-tune a pretrained encoder, and the baselines it is
judged against.

Part III's one lesson is measured with these pieces (chapter 8's learning curve)::

    val, pool = finetune.split_validation(train_rows, 500, seed=0)
    draw = finetune.balanced_sample(pool, 64, seed=1)          # 64 labels, the first draw
    seqs = finetune.encode_reviews(tok, draw, max_len=256, head=64)
    model = finetune.classifier(minilm)                         # or finetune.classifier(None, cfg): random weights
    finetune.fine_tune(model, seqs, labels, lr=1e-4, steps=50, batch_size=16, seed=1, device=dev)
    finetune.accuracy(model, test_seqs, test_labels, device=dev)

and two baselines that read the same labels: logistic regression on frozen sentence vectors
(:func:`frozen_features`) and on TF-IDF word uni- and bigrams (:func:`tfidf_features`), each
with its regularisation chosen on the validation split (:func:`logistic_regression`).

Draws are *nested*: for one seed, the 64-label draw holds the 32-label one, so a curve over
sizes is smooth in the draw and differences between sizes are not reshuffles of the data.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F

from lib import text, train
from lib.device import autocast
from lib.validate import check_float, check_int

__all__ = ["clean_review", "balanced_sample", "split_validation", "head_tail", "encode_reviews", "pad",
           "classifier", "fine_tune", "lm_loss", "predict", "accuracy", "frozen_features", "tfidf_features",
           "logistic_regression", "steps_for", "FINE_TUNE_DROPOUT", "checkpoint_encoder", "imdb_curve_recipe",
           "nsmc_curve_recipe", "imdb_gpt_curve_recipe", "SPECIAL", "class_logits", "curve_trials", "CurveData",
           "run_trial", "run_trials", "select_by_validation", "baseline_rows", "curve_metrics", "run_curve"]


def clean_review(text: str) -> str:
    """IMDB's reviews keep the HTML line breaks of the site: ``<br />`` becomes a space."""
    return text.replace("<br />", " ")


def _by_label(rows) -> dict[int, list]:
    out: dict[int, list] = {}
    for r in rows:
        out.setdefault(int(r["label"]), []).append(r)
    return out


def balanced_sample(rows: Sequence[dict], n: int, seed: int) -> list[dict]:
    """``n`` rows, ``n // len(classes)`` of each label, drawn with ``seed``; interleaved by label.

    Nested: for the same ``rows`` and ``seed``, the sample of ``n`` starts with the sample of any
    smaller ``n`` (each class is a prefix of one fixed permutation)."""
    check_int("n", n, 1)
    check_int("seed", seed, 0)
    groups = _by_label(rows)
    if len(groups) < 2:
        raise ValueError(f"balanced_sample needs rows of at least two labels, got labels {sorted(groups)}")
    per = n // len(groups)
    if per < 1 or per * len(groups) != n:
        raise ValueError(f"n={n} cannot be split evenly over {len(groups)} labels")
    short = {c: len(g) for c, g in groups.items() if len(g) < per}
    if short:
        raise ValueError(f"asked for {per} rows per label, but labels {short} have fewer")
    g = torch.Generator().manual_seed(seed)
    picked = {c: [grp[i] for i in torch.randperm(len(grp), generator=g)[:per].tolist()]
              for c, grp in sorted(groups.items())}
    return [picked[c][i] for i in range(per) for c in sorted(picked)]


def split_validation(rows: Sequence[dict], n_val: int, seed: int) -> tuple[list[dict], list[dict]]:
    """A balanced validation split of ``n_val`` rows and the rest (the pool labelled sets are drawn
    from). Hyper-parameters are chosen on the validation split, never on the test set."""
    val = balanced_sample(rows, n_val, seed)
    taken = {id(r) for r in val}
    return val, [r for r in rows if id(r) not in taken]


def head_tail(ids: Sequence[int], max_len: int, head: int, cls_id: int, sep_id: int) -> list[int]:
    """``[CLS]`` + the first ``head`` pieces + the last ones + ``[SEP]``, at most ``max_len`` in all
    (Sun et al. 2019: on IMDB, head and tail beat either end alone). Short inputs are kept whole."""
    check_int("max_len", max_len, 3)
    check_int("head", head, 0, max_len - 2)
    body = max_len - 2
    ids = list(ids)
    if len(ids) > body:
        ids = ids[:head] + ids[len(ids) - (body - head):]
    return [cls_id, *ids, sep_id]


#: the tokens around a review, by model family: BERT reads ``[CLS] review [SEP]``; GPT-1's
#: classifier reads ``[BOS] review [CLS]`` and classifies from the final state of that last token
SPECIAL = {"bert": ("[CLS]", "[SEP]"), "gpt": ("[BOS]", "[CLS]")}


def encode_reviews(tokenizer, rows: Sequence[dict], max_len: int, head: int,
                   special: tuple[str, str] = SPECIAL["bert"]) -> list[list[int]]:
    """Each row's ``text`` as subword ids cut head+tail to ``max_len``, between the two ``special``
    tokens (BERT's ``[CLS]``/``[SEP]`` by default), with a ``tokenizers.Tokenizer`` such as
    ``lib.minilm.minilm_tokenizer()`` or a course checkpoint's."""
    tokenizer.no_truncation()
    tokenizer.no_padding()
    first, last = (tokenizer.token_to_id(t) for t in special)
    if first is None or last is None:
        raise ValueError(f"the tokenizer has no {special[0]} or {special[1]} token")
    encs = tokenizer.encode_batch([clean_review(r["text"]) for r in rows], add_special_tokens=False)
    return [head_tail(e.ids, max_len, head, first, last) for e in encs]


def pad(seqs: Sequence[Sequence[int]], pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad to the longest (``lib.text.pad_batch``): ``ids (B, T)`` and ``keep (B, T)`` (1 on
    real tokens)."""
    x, lengths = text.pad_batch(seqs, pad_id=pad_id)
    return x, (torch.arange(x.shape[1])[None, :] < lengths[:, None]).long()


def _by_length(seqs: Sequence[Sequence[int]], batch_size: int, device):
    """Batches of similar lengths (less padding to compute): ``(indices, ids, keep)`` on ``device``."""
    check_int("batch_size", batch_size, 1)
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    for s in range(0, len(order), batch_size):
        idx = order[s:s + batch_size]
        x, keep = pad([seqs[i] for i in idx])
        yield idx, x.to(device), keep.to(device)


def _is_gpt(model) -> bool:
    from lib.models.gpt import GPT, GPTClassifier, GPTConfig
    return isinstance(model, (GPT, GPTClassifier, GPTConfig))


def classifier(pretrained=None, cfg=None, num_labels: int = 2, seed: int = 0):
    """A ``BertForSequenceClassification`` on the mean of the last states: the encoder's weights
    copied from ``pretrained`` (a ``BertModel``), or, with ``pretrained=None``, the same
    architecture ``cfg`` from random initialisation (BERT's N(0, 0.02)), seeded with ``seed``.
    A ``GPT`` (or a ``GPTConfig``) gives GPT-1's ``GPTClassifier`` instead: a linear layer on the
    final state of the last token, and the language-model head kept for the auxiliary loss."""
    from lib.models import bert as B
    if (pretrained is None) == (cfg is None):
        raise ValueError("give exactly one of pretrained (a BertModel) or cfg (a BertConfig for random weights)")
    torch.manual_seed(seed)
    if _is_gpt(pretrained if pretrained is not None else cfg):
        from lib.models.gpt import GPT, GPTClassifier
        gpt = GPT(pretrained.cfg if pretrained is not None else cfg)
        if pretrained is not None:
            gpt.load_state_dict(pretrained.state_dict())
        return GPTClassifier(gpt, num_classes=num_labels)
    model = B.BertForSequenceClassification(pretrained.cfg if pretrained is not None else cfg,
                                            num_labels=num_labels, pooling="mean")
    if pretrained is not None:
        missing, unexpected = model.bert.load_state_dict(pretrained.state_dict(), strict=False)
        if missing or any(not k.startswith("pooler.") for k in unexpected):
            raise ValueError(f"the pretrained encoder does not fit: missing {missing}, unexpected {unexpected}")
    return model


#: BERT's dropout for fine-tuning; the course's checkpoints were pretrained without (they underfit their corpus)
FINE_TUNE_DROPOUT = {"dropout": 0.1, "attention_dropout": 0.1}


def checkpoint_encoder(name: str, dropout: dict | None = None):
    """(encoder, tokenizer) of the course's checkpoint ``name`` (``lib.checkpoints``, e.g.
    ``"ko-bert"``, a snapshot ``"ko-bert@3M"``, or ``"gpt-imdb"``): its ``BertModel`` (or, for a
    GPT, the whole ``GPT``) in eval mode, built with the dropout rates for fine-tuning
    (``dropout``, default :data:`FINE_TUNE_DROPOUT`), and the ``tokenizers.Tokenizer`` it was
    pretrained with, for :func:`encode_reviews`."""
    from lib import checkpoints
    entry = checkpoints.info(name)
    if entry.kind == "gpt-lm":
        rates = {"dropout": (FINE_TUNE_DROPOUT if dropout is None else dropout)["dropout"]}
    elif entry.kind == "bert-mlm":
        rates = FINE_TUNE_DROPOUT if dropout is None else dropout
    else:
        raise ValueError(f"checkpoint {name!r} is a {entry.kind} model, neither a BERT nor a GPT")
    ckpt = checkpoints.load(name, config={**entry.config, **rates})
    model = ckpt.model if entry.kind == "gpt-lm" else ckpt.model.bert
    return model.eval(), ckpt.tokenizer.hf


def steps_for(n: int, epochs: float, batch_size: int, min_steps: int) -> int:
    """Optimizer steps for ``n`` examples: ``epochs`` passes, but at least ``min_steps``
    (a few labels still get enough updates for the new output layer to settle)."""
    return max(min_steps, math.ceil(epochs * n / batch_size))


def class_logits(model, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """The class scores of a classifier from :func:`classifier` for padded ``x`` and ``keep``."""
    return model(x, keep.bool())[0] if _is_gpt(model) else model(x, None, keep)


def lm_loss(lm_logits: torch.Tensor, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """GPT-1's auxiliary loss L1: next-token cross-entropy over the real tokens of each input
    (``lm_logits`` ``(B, T, V)`` of the inputs ``x`` ``(B, T)``, ``keep`` True at real tokens)."""
    target = x[:, 1:].masked_fill(~keep[:, 1:].bool(), -100)
    return F.cross_entropy(lm_logits[:, :-1].flatten(0, 1).float(), target.flatten(), ignore_index=-100)


def fine_tune(model, seqs: Sequence[Sequence[int]], labels: Sequence[int], *, lr: float, steps: int,
              batch_size: int, seed: int, device, head_lr: float | None = None, warmup: float = 0.1,
              weight_decay: float = 0.01, aux_lm: float = 0.0):
    """Train every weight of ``model`` (a classifier from :func:`classifier`) with AdamW, a linear
    warm-up over the first ``warmup`` of the ``steps`` and a cosine decay; the new output layer gets
    ``head_lr`` (default: ``lr``). Batches are padded to their longest review. For a GPT, ``aux_lm``
    adds GPT-1's auxiliary language-model loss: ``L3 = L2 + aux_lm * L1``. Returns the model."""
    if aux_lm and not _is_gpt(model):
        raise ValueError("aux_lm is GPT-1's auxiliary language-model loss: it needs a GPT classifier")
    check_float("lr", lr, positive=True)
    check_int("steps", steps, 1)
    check_int("batch_size", batch_size, 1)
    if len(seqs) != len(labels) or not seqs:
        raise ValueError(f"seqs and labels must be non-empty and of one length, got {len(seqs)} and {len(labels)}")
    new = ("classifier.", "head.")          # the new output layer (BERT's, GPT's)
    head = [p for n, p in model.named_parameters() if n.startswith(new)]
    body = [p for n, p in model.named_parameters() if not n.startswith(new)]
    opt = torch.optim.AdamW([{"params": body, "lr": lr}, {"params": head, "lr": head_lr or lr}],
                            weight_decay=weight_decay)
    sched = train.warmup_cosine(opt, warmup_steps=min(max(1, round(warmup * steps)), steps - 1), total_steps=steps)
    y = torch.as_tensor(list(labels), dtype=torch.long)
    order = list(range(len(seqs)))

    def collate(idx):
        x, keep = pad([seqs[i] for i in idx])
        return x, keep, y[idx]

    loader = train.make_loader(order, batch_size=min(batch_size, len(seqs)), seed=seed, collate_fn=collate)

    def step(m, batch):
        x, keep, target = batch
        if not aux_lm:
            return F.cross_entropy(class_logits(m, x, keep).float(), target), {}
        logits, lm_logits = m(x, keep.bool())          # one pass gives both heads (GPT-1's L3)
        return F.cross_entropy(logits.float(), target) + aux_lm * lm_loss(lm_logits, x, keep), {}

    train.fit(model, loader, optimizer=opt, scheduler=sched, step_fn=step, epochs=None, max_steps=steps,
              log_every=None, device=device, progress=False, seed=seed)
    return model


@torch.no_grad()
def predict(model, seqs: Sequence[Sequence[int]], device, batch_size: int = 64) -> torch.Tensor:
    """The predicted label of every sequence, in order (batched by length: less padding)."""
    was = model.training
    model.eval().to(device)
    out = torch.empty(len(seqs), dtype=torch.long)
    for idx, x, keep in _by_length(seqs, batch_size, device):
        with autocast(device, model):
            logits = class_logits(model, x, keep)
        out[idx] = logits.float().argmax(-1).cpu()
    model.train(was)
    return out


def accuracy(model, seqs, labels, device, batch_size: int = 64) -> float:
    """The share of ``labels`` that ``model`` predicts."""
    y = torch.as_tensor(list(labels), dtype=torch.long)
    return (predict(model, seqs, device, batch_size) == y).float().mean().item()


@torch.no_grad()
def frozen_features(encoder, seqs: Sequence[Sequence[int]], device, batch_size: int = 64) -> torch.Tensor:
    """Mean-pooled, L2-normalised last states of a frozen ``BertModel`` (all-MiniLM-L6-v2's sentence
    vector), ``(N, hidden)`` float32 on the cpu, in the order of ``seqs``. For a frozen ``GPT``, the
    final state of each input's last token (the one GPT-1's classifier reads), L2-normalised."""
    from lib.models.bert import mean_pool
    was = encoder.training
    encoder.eval().to(device)
    gpt = _is_gpt(encoder)
    out = torch.empty(len(seqs), encoder.cfg.n_embd if gpt else encoder.cfg.hidden_size)
    for idx, x, keep in _by_length(seqs, batch_size, device):
        with autocast(device, encoder):
            if gpt:
                hidden = encoder.hidden_states(x, keep.bool())
                vec = hidden[torch.arange(len(x), device=x.device), keep.sum(1) - 1]
            else:
                vec = mean_pool(encoder(x, None, keep).last_hidden_state.float(), keep)
        out[idx] = F.normalize(vec.float(), dim=-1).cpu()
    encoder.train(was)
    return out


def tfidf_features(train_texts: Sequence[str], *others: Sequence[str], ngrams: tuple[int, int] = (1, 2),
                   min_df: int = 2, analyzer: str = "word"):
    """TF-IDF vectors of word uni- and bigrams (sublinear term frequency), the vocabulary learned on
    ``train_texts`` only; returns the sparse matrices of ``train_texts`` and of each of ``others``.
    ``analyzer="char_wb"`` counts character n-grams inside words instead (``ngrams`` then counts
    characters): the stronger bag for Korean, whose words carry their particles and endings."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    if analyzer not in ("word", "char_wb"):
        raise ValueError(f"analyzer must be 'word' or 'char_wb', got {analyzer!r}")
    def fit(df):
        vec = TfidfVectorizer(ngram_range=ngrams, min_df=df, sublinear_tf=True, analyzer=analyzer,
                              preprocessor=lambda t: clean_review(t).lower())
        return vec, vec.fit_transform(train_texts)

    try:
        vec, train_x = fit(min(min_df, len(train_texts)))
    except ValueError:      # a handful of short reviews may share no term: keep the terms seen once
        vec, train_x = fit(1)
    return (train_x, *(vec.transform(t) for t in others))


def logistic_regression(train_x, train_y, val_x, val_y, test_x, test_y,
                        strengths: Sequence[float] = (0.1, 1.0, 10.0, 100.0)) -> dict:
    """L2-regularised logistic regression, its inverse strength ``C`` chosen on the validation
    split: ``{"C", "val_accuracy", "test_accuracy", "val_by_C"}``. Inputs: dense arrays/tensors or
    sparse matrices; labels as sequences of ints."""
    import numpy as np
    from sklearn.linear_model import LogisticRegression
    if not strengths:
        raise ValueError("strengths must name at least one C")

    def arr(a):
        return a.numpy() if isinstance(a, torch.Tensor) else a

    train_x, val_x, test_x = arr(train_x), arr(val_x), arr(test_x)
    ty, vy, sy = (np.asarray(list(v)) for v in (train_y, val_y, test_y))
    fits = {}
    for c in strengths:
        check_float("C", c, positive=True)
        m = LogisticRegression(C=c, max_iter=2000).fit(train_x, ty)
        fits[c] = (float((m.predict(val_x) == vy).mean()), m)
    best = max(fits, key=lambda c: (fits[c][0], -c))       # ties: the stronger regularisation
    return {"C": best, "val_accuracy": fits[best][0],
            "test_accuracy": float((fits[best][1].predict(test_x) == sy).mean()),
            "val_by_C": {f"{c:g}": a for c, (a, _) in fits.items()}}


# ----------------------------------------------------------------------------- the few-label learning curve

def imdb_curve_recipe(mode: str | None = None):
    """The two recipes of chapter 8's learning curve on IMDB (``tools/transfer_curve.py`` runs the
    full one, sized for a GPU: 8 sizes x 3 draws x 3 learning rates per arm, 10,000 test reviews)."""
    from lib import config
    return config.recipe(
        ci=dict(sizes=[64], seeds=[0], lrs={"pretrained": [1e-4], "random": [3e-4]}, val_size=100,
                test_size=300, max_len=96, head=24, batch_size=16, epochs=4, min_steps=16, head_lr=1e-3,
                all_labels=None),
        full=dict(sizes=[16, 32, 64, 128, 256, 512, 1024, 2048], seeds=[0, 1, 2],
                  lrs={"pretrained": [3e-5, 1e-4, 3e-4], "random": [1e-4, 3e-4, 1e-3]}, val_size=500,
                  test_size=10_000, max_len=256, head=64, batch_size=16, epochs=4, min_steps=50, head_lr=1e-3,
                  all_labels=dict(max_len=512, head=128, epochs=2, batch_size=32, lrs=[2e-5, 5e-5], seed=0)),
        mode_=mode)


def nsmc_curve_recipe(mode: str | None = None):
    """The two recipes of the course's Korean BERT checkpoint (``ko-bert``) on NSMC sentiment
    (``tools/transfer_curve.py --curve nsmc-ko-bert``): its few-label curve and, at ``emergence_sizes``,
    the fine-tuning accuracy of the snapshots saved along its pretraining (how transfer emerges).
    Reviews are short (a median of about 30 pieces), so 62 pieces hold almost all of them whole."""
    from lib import config
    return config.recipe(
        ci=dict(sizes=[100], seeds=[0], lrs={"pretrained": [3e-4], "random": [1e-3]}, val_size=100,
                test_size=400, max_len=64, head=40, batch_size=16, epochs=4, min_steps=50, head_lr=1e-3,
                emergence_sizes=[], all_labels=None),
        full=dict(sizes=[100, 300, 1000], seeds=[0, 1, 2],
                  lrs={"pretrained": [1e-4, 3e-4, 1e-3], "random": [3e-4, 1e-3, 3e-3]}, val_size=500,
                  test_size=5000, max_len=64, head=40, batch_size=16, epochs=4, min_steps=50, head_lr=1e-3,
                  emergence_sizes=[100, 1000], all_labels=None),
        mode_=mode)


def imdb_gpt_curve_recipe(mode: str | None = None):
    """The course's GPT checkpoint (``gpt-imdb``) on IMDB (``tools/transfer_curve.py --curve imdb-gpt``):
    GPT-1's fine-tuning, ``[BOS] review [CLS]`` cut head+tail to the checkpoint's 128 positions, the
    class read from the last token's state, and the auxiliary language-model loss (``aux_lm``).
    Sized for this course's 2-core CPU (every run reads 128 positions of each test review, about
    three times a ko-bert run's): 2,000 test reviews, and the sizes recorded so far."""
    from lib import config
    return config.recipe(
        ci=dict(sizes=[100], seeds=[0], lrs={"pretrained": [3e-4], "random": [1e-3]}, val_size=100,
                test_size=400, max_len=128, head=32, batch_size=16, epochs=4, min_steps=50, head_lr=1e-3,
                emergence_sizes=[], all_labels=None, family="gpt", aux_lm=0.5),
        full=dict(sizes=[100, 500, 1000], seeds=[0, 1, 2],
                  lrs={"pretrained": [1e-4, 3e-4, 1e-3], "random": [3e-4, 1e-3, 3e-3]}, val_size=500,
                  test_size=2000, max_len=128, head=32, batch_size=16, epochs=4, min_steps=50, head_lr=1e-3,
                  emergence_sizes=[], all_labels=None, family="gpt", aux_lm=0.5),
        mode_=mode)


def curve_trials(sizes: Sequence[int], seeds: Sequence[int], lrs: dict[str, Sequence[float]]) -> list[dict]:
    """Every fine-tuning run of a learning curve: one per ``(init, labels, seed, lr)``, ``init`` in
    ``lrs`` (``"pretrained"``, ``"random"``), the largest first (so that shards of the list, taken
    round-robin, get about equal work)."""
    trials = [{"init": init, "labels": int(n), "seed": int(s), "lr": float(lr)}
              for init, grid in lrs.items() for n in sizes for s in seeds for lr in grid]
    if not trials:
        raise ValueError("no trials: sizes, seeds and lrs must all be non-empty")
    return sorted(trials, key=lambda t: (-t["labels"], t["init"], t["seed"], t["lr"]))


class CurveData:
    """The fixed splits of a learning curve on a labelled corpus (rows with ``text`` and ``label``):
    a balanced validation split and the pool of the rest (drawn from the training rows), the test
    rows, and every review encoded once (``seqs``: row index -> ids)."""

    def __init__(self, train_rows, test_rows, *, val_size: int, test_size: int, max_len: int, head: int,
                 tokenizer, sizes: Sequence[int], seeds: Sequence[int], split_seed: int = 12345,
                 special: tuple[str, str] = SPECIAL["bert"]):
        self.val, self.pool = split_validation(train_rows, val_size, split_seed)
        self.test = test_rows if test_size >= len(test_rows) else balanced_sample(test_rows, test_size, split_seed)
        self.draws = {s: balanced_sample(self.pool, max(sizes), s) for s in seeds}
        self.max_len, self.head = max_len, head
        needed = {id(r): r for rows in (self.val, self.test, *self.draws.values()) for r in rows}
        rows = list(needed.values())
        self.seqs = dict(zip(needed, encode_reviews(tokenizer, rows, max_len, head, special)))

    @classmethod
    def from_recipe(cls, hp, train_rows, test_rows, tokenizer) -> "CurveData":
        """The splits and encodings a recipe of :func:`imdb_curve_recipe` asks for (its ``family``,
        ``"bert"`` when it names none, picks the tokens around a review: :data:`SPECIAL`)."""
        return cls(train_rows, test_rows, val_size=hp.val_size, test_size=hp.test_size, max_len=hp.max_len,
                   head=hp.head, tokenizer=tokenizer, sizes=hp.sizes, seeds=hp.seeds,
                   special=SPECIAL[getattr(hp, "family", "bert")])

    def encoded(self, rows) -> tuple[list[list[int]], list[int]]:
        return [self.seqs[id(r)] for r in rows], [int(r["label"]) for r in rows]

    def draw(self, n: int, seed: int) -> list[dict]:
        """The first ``n`` of seed ``seed``'s draw: balanced, nested across ``n``."""
        d = self.draws[seed]
        if n > len(d) or n % 2:
            raise ValueError(f"draw of {n} labels: expected an even number up to {len(d)}")
        return d[:n]


def run_trial(trial: dict, data: CurveData, pretrained, *, batch_size: int, epochs: float, min_steps: int,
              head_lr: float, device, validate: bool = True, aux_lm: float = 0.0) -> dict:
    """Fine-tune one classifier of ``trial`` (see :func:`curve_trials`) and measure it on the
    validation split (unless ``validate=False``: nothing to choose when an arm has one learning
    rate) and the test rows: the trial with ``val_accuracy`` (None when not measured),
    ``test_accuracy``, ``steps`` and ``seconds`` added."""
    import time
    start = time.perf_counter()
    seqs, labels = data.encoded(data.draw(trial["labels"], trial["seed"]))
    if trial["init"] == "pretrained":
        model = classifier(pretrained, seed=trial["seed"])
    elif trial["init"] == "random":
        model = classifier(None, pretrained.cfg, seed=trial["seed"])
    else:
        raise ValueError(f"trial init must be 'pretrained' or 'random', got {trial['init']!r}")
    steps = steps_for(len(seqs), epochs, batch_size, min_steps)
    fine_tune(model, seqs, labels, lr=trial["lr"], head_lr=max(head_lr, trial["lr"]), steps=steps,
              batch_size=batch_size, seed=trial["seed"], device=device, aux_lm=aux_lm)
    val = accuracy(model, *data.encoded(data.val), device=device, batch_size=256) if validate else None
    test = accuracy(model, *data.encoded(data.test), device=device, batch_size=256)
    return {**trial, "val_accuracy": val, "test_accuracy": test, "steps": steps,
            "seconds": round(time.perf_counter() - start, 1)}


def run_trials(hp, data: CurveData, pretrained, trials: Sequence[dict], device):
    """:func:`run_trial` of each of ``trials`` with the recipe's settings, one result at a time (a
    generator, so a caller can save each as it comes); validation only where an arm has several
    learning rates to choose from."""
    for t in trials:
        yield run_trial(t, data, pretrained, batch_size=hp.batch_size, epochs=hp.epochs, min_steps=hp.min_steps,
                        head_lr=hp.head_lr, device=device, validate=len(hp.lrs[t["init"]]) > 1,
                        aux_lm=getattr(hp, "aux_lm", 0.0))


def select_by_validation(runs: Sequence[dict], task: str, model: str) -> tuple[list[dict], dict]:
    """Per ``(init, labels)``, the learning rate with the best mean validation accuracy over the seeds
    (ties: the smaller rate); returns the transfer rows of those runs (test accuracy, one per seed)
    and ``{init: {labels: {"lr", "val_by_lr"}}}``."""
    groups: dict[tuple[str, int], dict[float, list[dict]]] = {}
    for r in runs:
        groups.setdefault((r["init"], r["labels"]), {}).setdefault(r["lr"], []).append(r)
    rows, chosen = [], {}
    for (init, n), by_lr in sorted(groups.items()):
        seeds = {lr: sorted(x["seed"] for x in rs) for lr, rs in by_lr.items()}
        if len({tuple(s) for s in seeds.values()}) != 1:
            raise ValueError(f"{init} at {n} labels: the learning rates were run on different seeds {seeds}")
        if len(by_lr) == 1:     # one learning rate: nothing to choose
            val = {lr: None for lr in by_lr}
        else:
            val = {lr: sum(x["val_accuracy"] for x in rs) / len(rs) for lr, rs in by_lr.items()}
        best = max(val, key=lambda lr: (val[lr] or 0.0, -lr))
        chosen.setdefault(init, {})[str(n)] = {"lr": best, "val_by_lr": {f"{lr:g}": v for lr, v in sorted(val.items()) if v is not None}}
        rows += [{"task": task, "model": model, "init": init, "labels": n, "seed": x["seed"],
                  "metric": "accuracy", "value": x["test_accuracy"]} for x in sorted(by_lr[best], key=lambda x: x["seed"])]
    return rows, chosen


def baseline_rows(data: CurveData, pretrained, sizes: Sequence[int], seeds: Sequence[int], *, task: str,
                  model: str, device, strengths: Sequence[float] = (0.1, 1.0, 10.0, 100.0),
                  char_ngrams: tuple[int, int] | None = None) -> tuple[list[dict], dict]:
    """Logistic regression on the frozen encoder's sentence vectors (``init="frozen"``) and on TF-IDF
    word uni+bigrams of the whole review (``init="tfidf"``), and with ``char_ngrams`` on TF-IDF
    character n-grams too (``init="tfidf-char"``), for every size and seed, each with its ``C``
    chosen on the validation split: transfer rows and the chosen ``C`` per run."""
    vx_seqs, vy = data.encoded(data.val)
    sx_seqs, sy = data.encoded(data.test)
    pool_rows = [r for d in data.draws.values() for r in d]
    feats = frozen_features(pretrained, [data.seqs[id(r)] for r in pool_rows], device, batch_size=256)
    feat = {id(r): f for r, f in zip(pool_rows, feats)}
    vfeat = frozen_features(pretrained, vx_seqs, device, batch_size=256)
    sfeat = frozen_features(pretrained, sx_seqs, device, batch_size=256)
    rows, chosen = [], {}
    for n in sizes:
        for s in seeds:
            draw = data.draw(n, s)
            y = [int(r["label"]) for r in draw]
            fz = logistic_regression(torch.stack([feat[id(r)] for r in draw]), y, vfeat, vy, sfeat, sy, strengths)
            tr, va, te = tfidf_features([r["text"] for r in draw], [r["text"] for r in data.val],
                                        [r["text"] for r in data.test])
            fits = [("frozen", model, fz), ("tfidf", "tfidf-logreg", logistic_regression(tr, y, va, vy, te, sy, strengths))]
            if char_ngrams is not None:
                tr, va, te = tfidf_features([r["text"] for r in draw], [r["text"] for r in data.val],
                                            [r["text"] for r in data.test], ngrams=char_ngrams, analyzer="char_wb")
                fits.append(("tfidf-char", "tfidf-char-logreg", logistic_regression(tr, y, va, vy, te, sy, strengths)))
            for init, name, res in fits:
                rows.append({"task": task, "model": name, "init": init,
                             "labels": n, "seed": s, "metric": "accuracy", "value": res["test_accuracy"]})
                chosen.setdefault(init, {})[f"{n}/{s}"] = res["C"]
    return rows, chosen


def curve_metrics(hp, trials: Sequence[dict], baselines: tuple[list[dict], dict], task: str, model: str) -> dict:
    """What a learning curve records: the ``transfer`` rows (each fine-tuned arm at the learning rate
    chosen on the validation split, and the baselines), the choices, and the sizes of the splits."""
    rows, lr_choice = select_by_validation(trials, task, model)
    base_rows, c_choice = baselines
    return {"transfer": rows + base_rows, "lr_choice": lr_choice, "C_choice": c_choice,
            "test_reviews": hp.test_size, "val_reviews": hp.val_size,
            "train_seconds": round(sum(t["seconds"] for t in trials), 1)}


def run_curve(hp, encoder, tokenizer, train_rows, test_rows, device, task: str = "imdb",
              model: str = "minilm", char_ngrams: tuple[int, int] | None = None) -> dict:
    """A whole learning curve in this process (``hp`` from :func:`imdb_curve_recipe` or
    :func:`nsmc_curve_recipe`): every fine-tuning run, the baselines (``char_ngrams``: see
    :func:`baseline_rows`), and :func:`curve_metrics` of them."""
    data = CurveData.from_recipe(hp, train_rows, test_rows, tokenizer)
    trials = list(run_trials(hp, data, encoder, curve_trials(hp.sizes, hp.seeds, hp.lrs), device))
    base = baseline_rows(data, encoder, hp.sizes, hp.seeds, task=task, model=model, device=device,
                         char_ngrams=char_ngrams)
    return curve_metrics(hp, trials, base, task, model)
