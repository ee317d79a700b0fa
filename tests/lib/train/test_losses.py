import pytest
import torch
import torch.nn.functional as F

from lib import train


def test_sequence_nats_sum_each_sequence_and_add_up_to_the_mean_loss():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 7, generator=g)
    targets = torch.randint(0, 7, (3, 5), generator=g)
    targets[1, 3:] = -100
    targets[2, 1:] = -100
    nats, counts = train.sequence_nats(logits, targets)
    assert counts.tolist() == [5.0, 3.0, 1.0]
    for b in range(3):
        real = targets[b] != -100
        expected = F.cross_entropy(logits[b][real], targets[b][real], reduction="sum")
        assert nats[b].item() == pytest.approx(expected.item(), rel=1e-6)
    # over the whole batch: the mean loss that training reports
    mean = F.cross_entropy(logits.transpose(1, 2), targets, ignore_index=-100)
    assert (nats.sum() / counts.sum()).item() == pytest.approx(mean.item(), rel=1e-6)
    assert nats.dtype == counts.dtype == torch.float64


def test_sequence_nats_reads_low_precision_logits_in_float32_and_another_ignore_index():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 4, 9, generator=g)
    targets = torch.randint(1, 9, (2, 4), generator=g)
    targets[0, 2:] = 0                                           # padding id 0
    nats, counts = train.sequence_nats(logits.bfloat16(), targets, ignore_index=0)
    ref, _ = train.sequence_nats(logits.bfloat16().float(), targets, ignore_index=0)
    assert torch.equal(nats, ref) and counts.tolist() == [2.0, 4.0]


@pytest.mark.parametrize("logits, targets, match", [
    (torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.long), r"\(B, T, V\)"),
    (torch.zeros(2, 3, 4), torch.zeros(2, 4, dtype=torch.long), "same B and T"),
    (torch.zeros(2, 3, 4), torch.zeros(2, 3), "integer ids"),
])
def test_sequence_nats_rejects_bad_shapes(logits, targets, match):
    with pytest.raises((ValueError, TypeError), match=match):
        train.sequence_nats(logits, targets)


def test_window_losses_give_each_window_its_mean_loss_in_order():
    from lib.models.gpt import GPT, GPTConfig
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=16)).train()
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randint(0, 11, (3, 8), generator=g), torch.randint(0, 11, (3, 8), generator=g)) for _ in range(2)]
    got = train.window_losses(model, batches)
    assert not model.training and len(got) == 6
    with torch.no_grad():
        expected = [F.cross_entropy(model(x)[0][i], y[i]).item() for x, y in batches for i in range(3)]
    assert got == pytest.approx(expected, rel=1e-6)
    # their mean is the mean loss over the windows (every window has the same length)
    x, y = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])
    with torch.no_grad():
        assert sum(got) / 6 == pytest.approx(F.cross_entropy(model(x)[0].flatten(0, 1), y.flatten()).item(), rel=1e-5)
