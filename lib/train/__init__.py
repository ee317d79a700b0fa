"""One training loop for every chapter: progress, mixed precision, clipping, schedules,
evaluation, a metrics history, and checkpoints that resume exactly.

A chapter writes only what is specific to its model, the loss of one batch::

    def step_fn(model, batch):
        x, y = batch                                  # already on the device
        logits = model(x)
        loss = F.cross_entropy(logits, y)
        return loss, {"acc": (logits.argmax(-1) == y).float().mean().item()}

    loader = train.make_loader(dataset, batch_size=32, shuffle=True, seed=0)
    history = train.fit(model, loader, optimizer=opt, step_fn=step_fn, epochs=3,
                        eval_fn=lambda m: {"loss": val_loss(m)}, device=dev)
    history.to_frame()                                # step, epoch, lr, train_loss, acc, eval_loss

The package, one module per job (everything public is re-exported here):

=================  ==========================================================================
``loop``           ``fit`` and its ``LoopState`` (exact resume and ``torchrun``: its docstring)
``loaders``        ``make_loader``, ``LengthBucketSampler``, ``GlobalBatchSampler``, ``to_device``, re-seeding
``schedules``      ``transformer_lr``, ``transformer_schedule``, ``warmup_cosine(_factor)``
``history``        ``History`` (the records of a run) and the metric averaging window
``checkpoint``     ``save_checkpoint``, ``load_checkpoint``, ``CheckpointError``
``rng``            python / numpy / torch / cuda random states in a weights-only form
``progress``       a tqdm bar or text lines
``distributed``    rank-0 broadcast, gradient and metric averaging under ``torchrun``
``losses``         ``sequence_nats``, ``window_losses``: each sequence's own loss, for comparisons paired over test items
=================  ==========================================================================
"""
from lib.train.checkpoint import CHECKPOINT_FORMAT, CheckpointError, load_checkpoint, save_checkpoint
from lib.train.history import History
from lib.train.loaders import GlobalBatchSampler, LengthBucketSampler, make_loader, to_device
from lib.train.loop import LoopState, fit
from lib.train.losses import sequence_nats, window_losses
from lib.train.schedules import transformer_lr, transformer_schedule, warmup_cosine, warmup_cosine_factor

__all__ = ["fit", "LoopState", "History", "to_device", "make_loader", "LengthBucketSampler", "GlobalBatchSampler",
           "transformer_lr",
           "transformer_schedule", "warmup_cosine_factor", "warmup_cosine", "save_checkpoint", "load_checkpoint",
           "CheckpointError", "CHECKPOINT_FORMAT", "sequence_nats", "window_losses"]
