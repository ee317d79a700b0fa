"""lib.layers: positional encoding (values, linear-shift property, offset), FFN, residual blocks."""
import math

import pytest
import torch

from lib.layers import (PositionalEncoding, PositionwiseFeedForward, ResidualBlock, shift_matrix,
                        sinusoidal_positional_encoding)


def test_pe_values_match_the_formula():
    d = 16
    pe = sinusoidal_positional_encoding(50, d)
    assert pe.shape == (50, d) and pe.dtype == torch.float32
    for pos in (0, 1, 7, 49):
        for i in range(d // 2):
            angle = pos / 10000 ** (2 * i / d)
            assert pe[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert pe[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_pe_odd_d_model():
    pe = sinusoidal_positional_encoding(10, 7)
    assert pe.shape == (10, 7)
    assert pe[3, 6].item() == pytest.approx(math.sin(3 / 10000 ** (6 / 7)), abs=1e-6)


@pytest.mark.parametrize("k", [1, 5, 37])
def test_pe_shift_is_linear(k):
    d = 32
    pe = sinusoidal_positional_encoding(200, d).double()
    m = shift_matrix(k, d)
    shifted = pe[:-k] @ m.T                       # one matrix for every position
    torch.testing.assert_close(shifted, pe[k:], atol=1e-6, rtol=0)   # float32 table
    assert not torch.allclose(pe[:-k], pe[k:], atol=1e-3)   # the shift does change the encoding


def test_shift_matrix_is_a_rotation_and_composes():
    m3, m4, m7 = shift_matrix(3, 8), shift_matrix(4, 8), shift_matrix(7, 8)
    torch.testing.assert_close(m3 @ m3.T, torch.eye(8, dtype=torch.float64))
    torch.testing.assert_close(m4 @ m3, m7)


def test_positional_encoding_adds_table_with_offset():
    pos = PositionalEncoding(8, max_len=20, dropout=0.0)
    x = torch.randn(2, 4, 8)
    table = sinusoidal_positional_encoding(20, 8)
    torch.testing.assert_close(pos(x), x + table[:4])
    torch.testing.assert_close(pos(x, offset=5), x + table[5:9])
    assert "pe" not in pos.state_dict()
    with pytest.raises(ValueError, match="max_len"):
        pos(x, offset=17)
    with pytest.raises(ValueError, match="d_model"):
        pos(torch.randn(2, 4, 6))


def test_ffn_is_positionwise_and_matches_formula():
    torch.manual_seed(0)
    ffn = PositionwiseFeedForward(6, 10, dropout=0.0)
    x = torch.randn(2, 5, 6)
    y = ffn(x)
    ref = torch.relu(x @ ffn.linear1.weight.T + ffn.linear1.bias) @ ffn.linear2.weight.T + ffn.linear2.bias
    torch.testing.assert_close(y, ref)
    x2 = x.clone()
    x2[:, 3] += 1.0
    y2 = ffn(x2)
    torch.testing.assert_close(y2[:, [0, 1, 2, 4]], y[:, [0, 1, 2, 4]])
    assert not torch.allclose(y2[:, 3], y[:, 3])
    g = PositionwiseFeedForward(6, 10, activation="gelu")(x)
    assert g.shape == x.shape
    with pytest.raises(ValueError, match="activation"):
        PositionwiseFeedForward(6, 10, activation="swish")


def test_residual_post_ln_and_pre_ln():
    torch.manual_seed(0)
    x = torch.randn(3, 4, 8) * 5 + 2
    f = torch.nn.Linear(8, 8)
    post = ResidualBlock(8, dropout=0.0, norm_first=False)
    pre = ResidualBlock(8, dropout=0.0, norm_first=True)
    y_post, y_pre = post(x, f), pre(x, f)
    ln = torch.nn.functional.layer_norm
    torch.testing.assert_close(y_post, ln(x + f(x), (8,)))
    torch.testing.assert_close(y_pre, x + f(ln(x, (8,))))
    # post-LN output is normalised; pre-LN keeps the un-normalised identity path
    assert y_post.mean(-1).abs().max() < 1e-5
    assert y_pre.mean(-1).abs().max() > 0.5
    zero = lambda h: torch.zeros_like(h)
    torch.testing.assert_close(pre(x, zero), x)


def test_pe_argument_errors():
    with pytest.raises(ValueError, match="max_len"):
        sinusoidal_positional_encoding(0, 8)
    with pytest.raises(TypeError, match="d_model"):
        sinusoidal_positional_encoding(4, 8.0)
    with pytest.raises(ValueError, match="even"):
        shift_matrix(1, 7)


def test_num_parameters_counts_tied_tensors_once_and_leaves_out_excluded_modules():
    from lib.layers import num_parameters

    emb, lin = torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10)
    model = torch.nn.ModuleDict({"emb": emb, "lin": lin, "ffn": torch.nn.Linear(4, 4)})
    assert num_parameters(model) == 40 + 50 + 20
    lin.weight = emb.weight                                  # tied: one tensor, counted once
    assert num_parameters(model) == 40 + 10 + 20
    assert num_parameters(model, exclude=[emb]) == 10 + 20     # the tied weight goes with emb
    assert num_parameters(model, exclude=[emb, lin]) == 20
    model["ffn"].weight.requires_grad_(False)                # frozen parameters still count
    assert num_parameters(model, exclude=[emb, lin]) == 20
    with pytest.raises(TypeError, match="module must be a torch.nn.Module"):
        num_parameters([emb])
