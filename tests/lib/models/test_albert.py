"""lib.models.albert against Hugging Face's ALBERT: outputs with weights copied, parameter counts."""
import pytest
import torch

from lib.layers import count_parameters
from lib.models.albert import PUBLISHED, AlbertConfig, AlbertForPreTraining, AlbertModel, load_hf_albert
from lib.models.bert import BertConfig, BertModel
from lib.models.reference import randomise

transformers = pytest.importorskip("transformers")

SMALL = dict(vocab_size=53, embedding_size=16, hidden_size=32, num_layers=3, num_heads=4, intermediate_size=48,
             max_position=24)


def _hf_config(**extra):
    return transformers.AlbertConfig(
        vocab_size=SMALL["vocab_size"], embedding_size=SMALL["embedding_size"], hidden_size=SMALL["hidden_size"],
        num_hidden_layers=SMALL["num_layers"], num_attention_heads=SMALL["num_heads"],
        intermediate_size=SMALL["intermediate_size"], max_position_embeddings=SMALL["max_position"],
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, classifier_dropout_prob=0.0, pad_token_id=0, **extra)


def _inputs():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, SMALL["vocab_size"], (3, 11), generator=g)
    types = torch.zeros_like(ids); types[:, 6:] = 1
    mask = torch.ones_like(ids); mask[1, 8:] = 0; mask[2, 5:] = 0
    ids[mask == 0] = 0
    return ids, types, mask


def test_pretraining_outputs_equal_hugging_face():
    torch.manual_seed(0)
    hf = randomise(transformers.AlbertForPreTraining(_hf_config())).eval()
    cfg = AlbertConfig.from_hf(hf.config)
    assert cfg == AlbertConfig(**SMALL, dropout=0.0, attention_dropout=0.0, classifier_dropout=0.0)
    ours = load_hf_albert(AlbertForPreTraining(cfg), hf).eval()
    ids, types, mask = _inputs()
    with torch.no_grad():
        ref = hf(input_ids=ids, token_type_ids=types, attention_mask=mask)
        got = ours(ids, types, mask)
    real = mask.bool()
    torch.testing.assert_close(got.mlm_logits[real], ref.prediction_logits[real], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.nsp_logits, ref.sop_logits, atol=1e-5, rtol=1e-5)
    assert ours.mlm.decoder.weight.data_ptr() == ours.bert.word_embeddings.weight.data_ptr()


def test_model_equals_hugging_face_and_layers_really_share():
    torch.manual_seed(1)
    hf = randomise(transformers.AlbertModel(_hf_config()), seed=4).eval()
    ours = load_hf_albert(AlbertModel(AlbertConfig(**SMALL, dropout=0.0, attention_dropout=0.0)), hf).eval()
    ids, types, mask = _inputs()
    with torch.no_grad():
        ref = hf(input_ids=ids, token_type_ids=types, attention_mask=mask, output_hidden_states=True)
        got = ours(ids, types, mask, output_hidden_states=True)
    real = mask.bool()
    torch.testing.assert_close(got.last_hidden_state[real], ref.last_hidden_state[real], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.pooled, ref.pooler_output, atol=1e-5, rtol=1e-5)
    assert len(got.hidden_states) == SMALL["num_layers"] + 1 and len(ours.encoder.layers) == 1


@pytest.mark.parametrize("name", ["ALBERT-base", "ALBERT-large", "ALBERT-xlarge", "ALBERT-xxlarge"])
def test_parameter_counts_at_published_configs_equal_hugging_face(name):
    cfg = PUBLISHED[name]
    with torch.device("meta"):
        hf = transformers.AlbertModel(transformers.AlbertConfig(
            vocab_size=30000, embedding_size=128, hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers,
            num_attention_heads=cfg.num_heads, intermediate_size=cfg.intermediate_size))
    assert count_parameters(AlbertModel, cfg) == sum(p.numel() for p in hf.parameters())


def test_factorised_embedding_and_sharing_counts():
    cfg = AlbertConfig(**SMALL, sharing="none")
    V, E, H, P = SMALL["vocab_size"], SMALL["embedding_size"], SMALL["hidden_size"], SMALL["max_position"]
    emb = count_parameters(AlbertModel, cfg) - count_parameters(AlbertModel, cfg, exclude_embeddings=True)
    assert emb == V * E + P * E + 2 * E + 2 * E + E * H + H        # tables, LayerNorm, projection
    per_layer = (count_parameters(AlbertModel, cfg) - count_parameters(AlbertModel, AlbertConfig(**{**SMALL, "num_layers": 1}, sharing="none"))) // 2
    attn = 4 * (H * H + H) + 2 * H
    ffn = (H * 48 + 48) + (48 * H + H) + 2 * H
    assert per_layer == attn + ffn
    L = SMALL["num_layers"]
    none = count_parameters(AlbertModel, cfg)
    assert count_parameters(AlbertModel, AlbertConfig(**SMALL, sharing="all")) == none - (L - 1) * (attn + ffn)
    assert count_parameters(AlbertModel, AlbertConfig(**SMALL, sharing="attention")) == none - (L - 1) * attn
    assert count_parameters(AlbertModel, AlbertConfig(**SMALL, sharing="ffn")) == none - (L - 1) * ffn


def test_no_sharing_with_full_width_embedding_is_bert():
    """E = H, no sharing, exact GELU: BERT plus one H x H projection."""
    cfg = AlbertConfig(**{**SMALL, "embedding_size": 32}, sharing="none", activation="gelu")
    bert = BertModel(BertConfig(**{k: v for k, v in SMALL.items() if k != "embedding_size"}))
    assert count_parameters(AlbertModel, cfg) == bert.num_parameters() + 32 * 32 + 32


@pytest.mark.parametrize("sharing", ["attention", "ffn"])
def test_partial_sharing_ties_the_modules(sharing):
    model = AlbertModel(AlbertConfig(**SMALL, sharing=sharing))
    first, last = model.encoder.layers[0], model.encoder.layers[-1]
    assert (getattr(first, sharing) is getattr(last, sharing))
    other = "ffn" if sharing == "attention" else "attention"
    assert getattr(first, other) is not getattr(last, other)


def test_from_hf_refuses_layer_groups_and_unknown_activations():
    with pytest.raises(ValueError, match="num_hidden_groups"):
        AlbertConfig.from_hf(_hf_config(num_hidden_groups=2))
    with pytest.raises(ValueError, match="hidden_act"):
        AlbertConfig.from_hf(_hf_config(hidden_act="silu"))


def test_bad_config_is_rejected():
    with pytest.raises(ValueError, match="sharing"):
        AlbertConfig(**SMALL, sharing="some")
    with pytest.raises(TypeError, match="AlbertConfig"):
        AlbertModel(BertConfig())
    with pytest.raises(ValueError, match="sharing='all'"):
        load_hf_albert(AlbertModel(AlbertConfig(**SMALL, sharing="none")), transformers.AlbertModel(_hf_config()))
