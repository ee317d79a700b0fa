"""The Switch Transformer's mixture-of-experts layer (Fedus, Zoph and Shazeer, 2021).

A Switch layer takes the place of a Transformer's feed-forward block. It holds ``E``
feed-forward networks, the *experts*, and a *router* that sends each token to exactly one
of them (top-1 routing). Read top to bottom, in the order the paper explains it::

    expert_capacity      capacity = tokens per group / experts x capacity factor
    route_top1           router probabilities -> expert, gate value, place in the expert's queue,
                         kept or dropped (tokens past an expert's capacity are dropped)
    load_balancing_loss  N * sum_i f_i * P_i (times alpha = 0.01 in the total loss)
    SwitchFFN            the layer: float32 router, dispatch, experts, combine
    ExpertParallelSwitchFFN   the same layer with its experts spread over processes
                         (``torch.distributed.all_to_all_single``), one group of experts each
    SwitchGPTConfig, SwitchGPT  the GPT of :mod:`lib.models.gpt` with every other MLP replaced
                         by a Switch layer, and the load-balancing loss added to its loss

The layer, for tokens ``x`` of one *group* (here: one sequence of the batch)::

    p(x)     = softmax(W_r x)                       router, computed in float32
    e(x)     = argmax_i p_i(x)                      top-1: one expert per token
    y(x)     = p_e(x) * FFN_e(x)                    gate value times the chosen expert's output
             = 0  if e(x) already received `capacity` tokens of this group earlier in it

The zero of a dropped token is added to the residual stream by the block around the layer
(``h + SwitchFFN(LN(h))``), so a dropped token passes to the next layer unchanged.

Experts are stored as stacked tensors ``w_in (E, d_model, d_ff)`` and ``w_out (E, d_ff,
d_model)``, and the tokens are dispatched into a buffer ``(E, groups x capacity, d_model)``:
the same fixed-shape layout the paper uses on TPUs, and the tensor that expert parallelism
exchanges between devices with an all-to-all.

The conventions of Hugging Face's ``SwitchTransformersSparseMLP`` (checked equal in
``tests/lib/models/test_switch.py`` with weights copied by :func:`load_hf_switch`): a group is one
sequence of the batch; within a group, tokens claim places in their expert's queue in
sequence order (the first tokens win, not the most confident ones); the expert's output is
scaled by the router probability of the chosen expert; the load-balancing loss counts each
token's top-1 choice *before* the capacity drop and averages ``N * sum_i f_i P_i`` over the
groups.

Explained in chapters/12_switch.ipynb.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

import torch
import torch.nn as nn
import torch.nn.functional as F

from lib import validate
from lib.layers import ACTIVATIONS
from lib.models.gpt import GPT, GPTConfig
from lib.models.reference import Source, as_state_dict, copy_weights

__all__ = ["expert_capacity", "Routing", "route_top1", "load_balancing_loss", "RouterStats", "SwitchFFN",
           "ExpertParallelSwitchFFN", "all_to_all", "SwitchGPTConfig", "SwitchGPT", "hf_sparse_mlp_table",
           "load_hf_switch"]


# ----------------------------------------------------------------------------- routing

def expert_capacity(tokens: int, num_experts: int, capacity_factor: float) -> int:
    """How many tokens of a group one expert may take: ``tokens / num_experts x capacity_factor``,
    rounded up (so that factor 1 holds a perfectly balanced routing), at least 1."""
    tokens = validate.check_int("tokens", tokens, minimum=1)
    num_experts = validate.check_int("num_experts", num_experts, minimum=1)
    capacity_factor = validate.check_float("capacity_factor", capacity_factor, positive=True)
    # round before ceil: 100 * 1.1 / 10 is 11.000000000000002 in floating point, and must give 11, not 12
    return max(1, math.ceil(round(tokens * capacity_factor / num_experts, 9)))


@dataclass
class Routing:
    """What the router decided for tokens ``(G, T)`` (G groups of T tokens) and E experts."""
    probs: torch.Tensor       # (G, T, E) float32: the router's softmax
    expert: torch.Tensor      # (G, T) long: the chosen expert (argmax)
    gate: torch.Tensor        # (G, T) float32: the probability of the chosen expert
    position: torch.Tensor    # (G, T) long: place in that expert's queue within the group (0, 1, ...)
    kept: torch.Tensor        # (G, T) bool: position < capacity; False = dropped
    capacity: int

    @property
    def num_experts(self) -> int:
        return self.probs.shape[-1]

    def dropped_fraction(self) -> float:
        return 1.0 - self.kept.float().mean().item()

    def expert_fraction(self) -> torch.Tensor:
        """``f_i``: the fraction of all tokens whose top-1 choice is expert i, ``(E,)``."""
        return torch.bincount(self.expert.flatten(), minlength=self.num_experts).float() / self.expert.numel()


def route_top1(probs: torch.Tensor, capacity: int) -> Routing:
    """Top-1 routing with a capacity: ``probs (G, T, E)`` (router softmax) -> :class:`Routing`.

    Each token picks its most probable expert. Within each group, the tokens of one expert
    take places 0, 1, 2, ... in sequence order; those at place ``capacity`` or later are
    dropped (``kept`` False)."""
    validate.check_tensor("probs", probs, dtype="float", dim=3, what="(groups, tokens, experts)")
    capacity = validate.check_int("capacity", capacity, minimum=1)
    expert = probs.argmax(dim=-1)                                        # (G, T)
    one_hot = F.one_hot(expert, probs.shape[-1])                         # (G, T, E)
    # place in the queue: how many tokens of the same group chose the same expert before this one
    position = (one_hot.cumsum(dim=1) - 1).gather(-1, expert[..., None]).squeeze(-1)
    gate = probs.gather(-1, expert[..., None]).squeeze(-1)
    return Routing(probs=probs, expert=expert, gate=gate, position=position, kept=position < capacity,
                   capacity=capacity)


def load_balancing_loss(probs: torch.Tensor, expert: torch.Tensor) -> torch.Tensor:
    """``N * sum_i f_i * P_i`` averaged over the groups (the paper's equation 4 without alpha).

    ``probs (G, T, E)``: router probabilities; ``expert (G, T)``: each token's top-1 choice.
    ``f_i`` is the fraction of the group's tokens sent to expert i (counted before any drop),
    ``P_i`` the mean router probability of expert i over the group. It equals 1 when routing is
    perfectly uniform (``f_i = P_i = 1/N``) and grows to N when every token goes to one expert
    with probability 1. Only ``P`` carries a gradient (``f`` comes from an argmax): the loss is
    lowest when the probability mass moves away from the experts that receive the most tokens.
    """
    validate.check_tensor("probs", probs, dtype="float", dim=3, what="(groups, tokens, experts)")
    validate.check_tensor("expert", expert, dtype="int", shape=tuple(probs.shape[:2]), what="(groups, tokens)")
    n = probs.shape[-1]
    f = F.one_hot(expert, n).to(probs.dtype).mean(dim=1)                 # (G, E)
    p = probs.mean(dim=1)                                                # (G, E)
    return n * (f * p).sum(dim=-1).mean()


# ----------------------------------------------------------------------------- the layer

@dataclass
class RouterStats:
    """What one forward pass of a Switch layer measured (``SwitchFFN.stats``)."""
    balance: torch.Tensor            # N * sum_i f_i P_i, scalar with gradient
    aux_loss: torch.Tensor           # alpha * balance
    expert_fraction: torch.Tensor    # (E,) f_i over all tokens of the batch
    dropped_fraction: float          # tokens past capacity / all tokens
    capacity: int


class SwitchFFN(nn.Module):
    """A Switch layer: a float32 router and ``num_experts`` feed-forward experts, top-1 routed.

    ``forward(x (B, T, d_model)) -> (B, T, d_model)``; each sequence of the batch is a group
    with ``expert_capacity(T, num_experts, capacity_factor)`` places per expert (or the fixed
    ``capacity`` when given, as Hugging Face's ``expert_capacity``). Dropped tokens get 0.
    The last pass's :class:`RouterStats` (load-balancing loss included) are in ``self.stats``.

    ``init_scale`` is the paper's reduced initialisation: weights from a normal truncated at
    two standard deviations with std ``sqrt(init_scale / fan_in)``, ``init_scale = 0.1``
    instead of the usual 1.0. ``expert_dropout`` is the dropout inside the experts (on their
    hidden activations), which the paper sets higher than elsewhere when fine-tuning.
    ``jitter`` multiplies the router's input by uniform noise in ``[1 - jitter, 1 + jitter]``
    during training (the paper's alternative to noise on the logits; 0 = off).
    """

    def __init__(self, d_model: int, d_ff: int, num_experts: int, capacity_factor: float = 1.25, *,
                 capacity: int | None = None, activation: str = "gelu_tanh", bias: bool = True,
                 router_bias: bool = False, expert_dropout: float = 0.0, jitter: float = 0.0,
                 aux_loss_coef: float = 0.01, init_scale: float = 0.1):
        super().__init__()
        self.d_model = validate.check_int("d_model", d_model, minimum=1)
        self.d_ff = validate.check_int("d_ff", d_ff, minimum=1)
        self.num_experts = validate.check_int("num_experts", num_experts, minimum=1)
        self.capacity_factor = validate.check_float("capacity_factor", capacity_factor, positive=True)
        self.capacity = validate.check_int("capacity", capacity, minimum=1, allow_none=True)
        self.activation = validate.check_choice("activation", activation, ACTIVATIONS)
        self.expert_dropout = validate.check_probability("expert_dropout", expert_dropout, allow_one=False)
        self.jitter = validate.check_float("jitter", jitter, 0.0, 1.0)
        self.aux_loss_coef = validate.check_float("aux_loss_coef", aux_loss_coef, 0.0)
        self.init_scale = validate.check_float("init_scale", init_scale, positive=True)
        self.router = nn.Linear(d_model, num_experts, bias=router_bias, dtype=torch.float32)
        self.w_in = nn.Parameter(torch.empty(self._local_experts(), d_model, d_ff))
        self.w_out = nn.Parameter(torch.empty(self._local_experts(), d_ff, d_model))
        self.b_in = nn.Parameter(torch.zeros(self._local_experts(), d_ff)) if bias else None
        self.b_out = nn.Parameter(torch.zeros(self._local_experts(), d_model)) if bias else None
        self.stats: RouterStats | None = None
        self.reset_parameters()

    def _local_experts(self) -> int:
        return self.num_experts

    def reset_parameters(self) -> None:
        """Truncated normal, std ``sqrt(init_scale / fan_in)``; biases 0."""
        for w, fan_in in ((self.router.weight, self.d_model), (self.w_in, self.d_model), (self.w_out, self.d_ff)):
            std = math.sqrt(self.init_scale / fan_in)
            nn.init.trunc_normal_(w, std=std, a=-2 * std, b=2 * std)
        for b in (self.router.bias, self.b_in, self.b_out):
            if b is not None:
                nn.init.zeros_(b)

    def group_capacity(self, tokens: int) -> int:
        return self.capacity if self.capacity is not None else expert_capacity(tokens, self.num_experts,
                                                                                 self.capacity_factor)

    # -- the three steps ------------------------------------------------------------------

    def route(self, x: torch.Tensor) -> Routing:
        """The router, in float32 whatever the dtype of ``x`` (bfloat16 keeps float32's exponent
        range but only 7 stored mantissa bits: too coarse for a softmax whose argmax decides)."""
        h = x.float()
        if self.training and self.jitter > 0:
            h = h * torch.empty_like(h).uniform_(1.0 - self.jitter, 1.0 + self.jitter)
        with torch.autocast(x.device.type, enabled=False):    # autocast would run the Linear in bf16
            logits = F.linear(h, self.router.weight.float(),
                              None if self.router.bias is None else self.router.bias.float())
        return route_top1(torch.softmax(logits, dim=-1, dtype=torch.float32), self.group_capacity(x.shape[1]))

    def dispatch(self, x: torch.Tensor, r: Routing) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokens ``(B, T, d)`` -> expert buffer ``(E, B * capacity, d)`` and each kept token's
        row in the flattened ``(B * E * capacity)`` buffer (``slot``; -1 for dropped tokens).
        Unused places stay zero."""
        B, T, d = x.shape
        C, E = r.capacity, self.num_experts
        group = torch.arange(B, device=x.device)[:, None]
        slot = torch.where(r.kept, (group * E + r.expert) * C + r.position, -1)      # (B, T)
        flat_slot, flat_x = slot.flatten(), x.reshape(B * T, d)
        kept = flat_slot >= 0
        buffer = x.new_zeros(B * E * C, d).index_copy(0, flat_slot[kept], flat_x[kept])
        buffer = buffer.view(B, E, C, d).transpose(0, 1).reshape(E, B * C, d)
        return buffer, slot

    def experts(self, buffer: torch.Tensor) -> torch.Tensor:
        """Every expert on its own tokens at once: ``(E, n, d) -> (E, n, d)``, one batched
        matrix product per layer of the experts."""
        h = torch.bmm(buffer, self.w_in)
        if self.b_in is not None:
            h = h + self.b_in[:, None, :]
        h = F.dropout(ACTIVATIONS[self.activation](h), self.expert_dropout, self.training)
        out = torch.bmm(h, self.w_out)
        if self.b_out is not None:
            out = out + self.b_out[:, None, :]
        return out

    def combine(self, expert_out: torch.Tensor, slot: torch.Tensor, r: Routing, shape: torch.Size) -> torch.Tensor:
        """Expert outputs back to token order, each scaled by its gate value; 0 for dropped tokens."""
        B, T, d = shape
        C, E = r.capacity, self.num_experts
        flat_out = expert_out.view(E, B, C, d).transpose(0, 1).reshape(B * E * C, d)
        flat_slot, kept = slot.flatten(), slot.flatten() >= 0
        gate = r.gate.flatten()[kept].to(expert_out.dtype)
        y = expert_out.new_zeros(B * T, d).index_copy(0, kept.nonzero().squeeze(1),
                                                      flat_out[flat_slot[kept]] * gate[:, None])
        return y.view(B, T, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        validate.check_tensor("x", x, dtype="float", dim=3, what="(batch, time, d_model)")
        if x.shape[-1] != self.d_model:
            raise ValueError(f"x must have d_model={self.d_model} features, got {x.shape[-1]}")
        r = self.route(x)
        buffer, slot = self.dispatch(x, r)
        y = self.combine(self.experts(buffer), slot, r, x.shape)
        balance = load_balancing_loss(r.probs, r.expert)
        self.stats = RouterStats(balance=balance, aux_loss=self.aux_loss_coef * balance,
                                 expert_fraction=r.expert_fraction().detach(),
                                 dropped_fraction=r.dropped_fraction(), capacity=r.capacity)
        return y

    def extra_repr(self) -> str:
        cap = f"capacity={self.capacity}" if self.capacity is not None else f"capacity_factor={self.capacity_factor}"
        return (f"d_model={self.d_model}, d_ff={self.d_ff}, num_experts={self.num_experts}, {cap}, "
                f"activation={self.activation}")


# ----------------------------------------------------------------------------- expert parallelism

class _AllToAll(torch.autograd.Function):
    """``all_to_all_single`` with equal splits, differentiable: chunk j of rank i goes to rank j
    as its chunk i. That exchange is its own transpose, so the backward pass is the same call on
    the gradient."""

    @staticmethod
    def forward(ctx, x, group):
        import torch.distributed as dist
        ctx.group = group
        out = torch.empty_like(x)
        dist.all_to_all_single(out, x.contiguous(), group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        import torch.distributed as dist
        out = torch.empty_like(grad)
        dist.all_to_all_single(out, grad.contiguous(), group=ctx.group)
        return out, None


def all_to_all(x: torch.Tensor, group=None) -> torch.Tensor:
    """Split ``x`` along dim 0 into world-size chunks; send chunk j to rank j; return the chunks
    received, in rank order (differentiable)."""
    return _AllToAll.apply(x, group)


class ExpertParallelSwitchFFN(SwitchFFN):
    """A :class:`SwitchFFN` whose experts are spread over the processes of a
    ``torch.distributed`` group: with W processes, process r holds experts
    ``r * E/W ... (r + 1) * E/W - 1``; the router is replicated (its gradient is averaged
    with the other data-parallel parameters).

    Every process routes its own tokens and fills its ``(E, n, d)`` buffer as the
    single-process layer does; an all-to-all sends each expert's rows to the process that
    holds it, the local experts run on the ``W * n`` rows they received, and a second
    all-to-all returns the outputs to the processes the tokens came from."""

    def __init__(self, *args, group=None, **kwargs):
        import torch.distributed as dist
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("ExpertParallelSwitchFFN needs an initialised torch.distributed process group")
        self.group = group
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        super().__init__(*args, **kwargs)
        if self.num_experts % self.world:
            raise ValueError(f"num_experts={self.num_experts} must be divisible by the number of processes "
                             f"({self.world})")

    def _local_experts(self) -> int:
        return self.num_experts // self.world

    @classmethod
    def from_full(cls, full: SwitchFFN, group=None) -> "ExpertParallelSwitchFFN":
        """This process's share of ``full``: the router and its slice of the experts."""
        layer = cls(full.d_model, full.d_ff, full.num_experts, full.capacity_factor, capacity=full.capacity,
                    activation=full.activation, bias=full.b_in is not None, router_bias=full.router.bias is not None,
                    expert_dropout=full.expert_dropout, jitter=full.jitter, aux_loss_coef=full.aux_loss_coef,
                    init_scale=full.init_scale, group=group)
        local = slice(layer.rank * layer._local_experts(), (layer.rank + 1) * layer._local_experts())
        with torch.no_grad():
            layer.router.load_state_dict(full.router.state_dict())
            for name in ("w_in", "w_out", "b_in", "b_out"):
                if getattr(full, name) is not None:
                    getattr(layer, name).copy_(getattr(full, name)[local])
        return layer

    def experts(self, buffer: torch.Tensor) -> torch.Tensor:
        E, n, d = buffer.shape
        local = E // self.world
        # (E, n, d): chunk r (experts of process r) -> process r; receive (W, local, n, d)
        received = all_to_all(buffer, self.group).view(self.world, local, n, d)
        mine = received.transpose(0, 1).reshape(local, self.world * n, d)     # local experts, all tokens
        out = super().experts(mine).view(local, self.world, n, d).transpose(0, 1).reshape(E, n, d)
        return all_to_all(out, self.group)                                     # back where they came from


# ----------------------------------------------------------------------------- a Switch GPT

@dataclass
class SwitchGPTConfig(GPTConfig):
    """A :class:`GPTConfig` plus the Switch layers. Every ``sparse_every``-th block (blocks
    ``sparse_every - 1, 2 * sparse_every - 1, ...``; every other one by default, as in the paper)
    has a Switch layer of ``num_experts`` experts, each as wide as GPT's MLP (``4 * n_embd``), in
    place of its MLP: the same FLOPs per token as the dense model, ``num_experts`` times the
    feed-forward parameters."""
    num_experts: int = 4
    capacity_factor: float = 1.25
    sparse_every: int = 2
    expert_dropout: float = 0.0
    aux_loss_coef: float = 0.01
    init_scale: float = 0.1
    jitter: float = 0.0

    def __post_init__(self):
        super().__post_init__()
        validate.check_int("num_experts", self.num_experts, minimum=1)
        validate.check_float("capacity_factor", self.capacity_factor, positive=True)
        validate.check_int("sparse_every", self.sparse_every, minimum=1)

    def sparse_layers(self) -> list[int]:
        return [i for i in range(self.n_layer) if i % self.sparse_every == self.sparse_every - 1]


class SwitchGPT(GPT):
    """GPT with Switch layers; ``forward`` adds the load-balancing losses of all Switch layers
    (``alpha * N * sum_i f_i P_i`` each) to the language-modelling loss."""

    def __init__(self, cfg: SwitchGPTConfig):
        if not isinstance(cfg, SwitchGPTConfig):
            raise TypeError(f"cfg must be a SwitchGPTConfig, got {type(cfg).__name__}")
        super().__init__(cfg)
        for i in cfg.sparse_layers():
            self.blocks[i].mlp = SwitchFFN(cfg.n_embd, 4 * cfg.n_embd, cfg.num_experts, cfg.capacity_factor,
                                           expert_dropout=cfg.expert_dropout, aux_loss_coef=cfg.aux_loss_coef,
                                           init_scale=cfg.init_scale, jitter=cfg.jitter)

    def switch_layers(self) -> list[SwitchFFN]:
        return [b.mlp for b in self.blocks if isinstance(b.mlp, SwitchFFN)]

    def set_capacity_factor(self, capacity_factor: float) -> None:
        """Change every Switch layer's capacity factor (e.g. a larger one for evaluation)."""
        capacity_factor = validate.check_float("capacity_factor", capacity_factor, positive=True)
        for layer in self.switch_layers():
            layer.capacity_factor = capacity_factor

    def aux_loss(self) -> torch.Tensor:
        """The sum of the Switch layers' load-balancing losses of the last forward pass."""
        return sum(layer.stats.aux_loss for layer in self.switch_layers())

    def forward(self, idx, targets=None, attention_mask=None):
        logits, loss = super().forward(idx, targets, attention_mask)
        if loss is not None:
            loss = loss + self.aux_loss()
        return logits, loss

    def num_active_parameters(self) -> int:
        """Parameters one token uses: every expert but one of each Switch layer left out."""
        inactive = sum((p.numel() // layer.num_experts) * (layer.num_experts - 1)
                       for layer in self.switch_layers()
                       for p in (layer.w_in, layer.w_out, layer.b_in, layer.b_out) if p is not None)
        return self.num_parameters() - inactive


# ----------------------------------------------------------------------------- references

def hf_sparse_mlp_table(num_experts: int, prefix: str = "", theirs_prefix: str = "") -> dict[str, Source | str]:
    """Our :class:`SwitchFFN` keys -> Hugging Face ``SwitchTransformersSparseMLP`` keys
    (``router.classifier``, ``experts.expert_{i}.wi`` / ``.wo``, ``nn.Linear`` without bias):
    the experts' matrices stacked and transposed."""
    def stack_t(*ws):
        return torch.stack([w.t() for w in ws])
    return {f"{prefix}router.weight": f"{theirs_prefix}router.classifier.weight",
            f"{prefix}w_in": Source(tuple(f"{theirs_prefix}experts.expert_{i}.wi.weight" for i in range(num_experts)),
                                    stack_t),
            f"{prefix}w_out": Source(tuple(f"{theirs_prefix}experts.expert_{i}.wo.weight" for i in range(num_experts)),
                                     stack_t)}


def load_hf_switch(ours: SwitchFFN, theirs: nn.Module | Mapping[str, torch.Tensor]) -> SwitchFFN:
    """Copy a Hugging Face ``SwitchTransformersSparseMLP`` (a layer or its state dict) into our
    :class:`SwitchFFN` (``bias=False``, as many experts), every weight used once. Returns ``ours``."""
    if not isinstance(ours, SwitchFFN):
        raise TypeError(f"ours must be our SwitchFFN, got {type(ours).__name__}")
    return copy_weights(ours, as_state_dict(theirs), hf_sparse_mlp_table(ours.num_experts))
