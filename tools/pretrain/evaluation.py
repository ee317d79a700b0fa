"""Held-out loss of a model of any family, and the dtype its weights are stored in."""
from __future__ import annotations


import torch
import torch.nn.functional as F

from lib import checkpoints
from lib.data import mlm
from tools.pretrain import reviews, tasks, translation
from tools.pretrain.corpora import masked_logits

DTYPE_TOLERANCE = 1e-3      # nats: a stored dtype may change the held-out loss by at most this much
#: the storages a checkpoint may be written in, smallest first (``lib.checkpoints.save_weights``)
DTYPES = {"int8": torch.int8, checkpoints.INT8_EMBEDDINGS: checkpoints.INT8_EMBEDDINGS, "float16": torch.float16,
          "bfloat16": torch.bfloat16, "float32": torch.float32}

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
        return (tasks if kind == tasks.KIND else translation).heldout_loss(model, batches)
    if kind == reviews.KIND:             # the validation reviews' mean binary cross-entropy
        if other_input:
            raise ValueError(f"other_input is not measured for {kind}")
        return reviews.heldout_loss(model, batches)
    if kind == "txl-lm":                 # the held-out streams, read a segment at a time with the trained memory
        from lib.models.transformer_xl import evaluate_with_memory
        (stream, seg_len), = batches
        return evaluate_with_memory(model, stream, int(seg_len), model.cfg.mem_len)["loss"]
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
        if kind == "xlnet-plm":           # each window's own order: the query stream's loss on its last positions
            predict = int(y)
            total += model.permutation_lm_loss(x, rest[0], predict).item() * len(x) * predict
            count += len(x) * predict
            continue
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
    return {name: heldout_loss(checkpoints.rounded_copy(model, dtype), batches, kind) for name, dtype in DTYPES.items()}


def storage_dtype(losses: dict[str, float]) -> str:
    """The smallest of int8 (with scales: ``lib.checkpoints.INT8_GROUP``), int8 embedding tables with float16
    elsewhere, float16 and bfloat16 whose held-out loss is within DTYPE_TOLERANCE of float32's; else float32.
    (A card written before a storage existed has no loss for it: that storage is not chosen.)"""
    for name in ("int8", checkpoints.INT8_EMBEDDINGS, "float16", "bfloat16"):
        if name in losses and abs(losses[name] - losses["float32"]) <= DTYPE_TOLERANCE:
            return name
    return "float32"
