"""The precision policy in use: under the course's bfloat16 autocast (``lib.device.autocast``)
the pieces that must stay float32 do, and the models' float32 arithmetic is untouched outside it.

``COURSE_PRECISION=bf16`` forces the autocast on any CPU (slowly where the CPU has no native
bfloat16: the models here are tiny)."""
import pytest
import torch
import torch.nn.functional as F

from lib import device as D
from lib.models.gpt import GPT, GPTConfig
from lib.models.switch import SwitchFFN
from lib.models.t5 import T5, T5Config


@pytest.fixture
def bf16(monkeypatch):
    monkeypatch.setenv("COURSE_PRECISION", "bf16")
    assert D.precision("cpu").dtype == torch.bfloat16


def test_switch_router_stays_float32_under_autocast(bf16):
    torch.manual_seed(0)
    layer = SwitchFFN(16, 32, 4, 2.0, init_scale=1.0).eval()
    x = torch.randn(2, 10, 16)
    exact = layer.route(x).probs                                  # float32, no autocast
    with D.autocast("cpu"):
        assert torch.is_autocast_enabled("cpu")
        r = layer.route(x)
        h = torch.bmm(layer.dispatch(x, r)[0], layer.w_in)
    assert h.dtype == torch.bfloat16                              # the experts' products run in bf16 ...
    assert r.probs.dtype == torch.float32
    assert torch.equal(r.probs, exact)                            # ... the router sees no bf16 at all


def test_losses_are_float32_under_autocast(bf16):
    torch.manual_seed(0)
    gpt = GPT(GPTConfig(vocab_size=50, block_size=16, n_layer=1, n_head=2, n_embd=16)).eval()
    t5 = T5(T5Config(vocab_size=50, d_model=16, d_kv=8, d_ff=32, num_heads=2, num_layers=1, dropout=0.0)).eval()
    idx = torch.randint(0, 50, (2, 8))
    with D.autocast("cpu"):
        logits, loss = gpt(idx, idx)
        t5_loss = t5(idx, idx)[1]
    assert logits.dtype == torch.bfloat16                         # the matmuls ran in bf16 ...
    assert loss.dtype == torch.float32 and t5_loss.dtype == torch.float32   # ... the losses did not
    assert loss.item() == pytest.approx(F.cross_entropy(logits.float().flatten(0, 1), idx.flatten()).item(),
                                        rel=1e-6)


def test_float32_outside_autocast_whatever_the_policy(bf16):
    torch.manual_seed(0)
    gpt = GPT(GPTConfig(vocab_size=50, block_size=16, n_layer=1, n_head=2, n_embd=16)).eval()
    idx = torch.randint(0, 50, (2, 8))
    logits, _ = gpt(idx)
    assert logits.dtype == torch.float32 and all(p.dtype == torch.float32 for p in gpt.parameters())
