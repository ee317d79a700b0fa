"""lib.models.bert against Hugging Face's BertModel / BertForPreTraining, parameter counts, inputs."""
import pytest
import torch

from lib.models.bert import (PUBLISHED, BertConfig, BertForPreTraining, BertForSequenceClassification,
                             BertModel, load_hf_bert)
from lib.models.reference import WeightCopyError, randomise

transformers = pytest.importorskip("transformers")

SMALL = dict(vocab_size=61, hidden_size=32, num_layers=3, num_heads=4, intermediate_size=48, max_position=24)


def _hf_config(**kw):
    return transformers.BertConfig(
        vocab_size=SMALL["vocab_size"], hidden_size=SMALL["hidden_size"], num_hidden_layers=SMALL["num_layers"],
        num_attention_heads=SMALL["num_heads"], intermediate_size=SMALL["intermediate_size"],
        max_position_embeddings=SMALL["max_position"], hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        **kw)


def _pair(pretraining=True, attn="sdpa"):
    torch.manual_seed(1)
    cls = transformers.BertForPreTraining if pretraining else transformers.BertModel
    hf = randomise(cls(_hf_config(attn_implementation=attn))).eval()
    ours = (BertForPreTraining if pretraining else BertModel)(BertConfig(**SMALL, dropout=0.0,
                                                                         attention_dropout=0.0)).eval()
    load_hf_bert(ours, hf)
    return ours, hf


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, SMALL["vocab_size"], (4, 13), generator=g)
    types = torch.zeros_like(ids)
    types[:, 6:] = 1                                   # segment B from position 6
    mask = torch.ones(4, 13, dtype=torch.long)
    mask[1, 9:] = 0                                    # right padding of different lengths
    mask[2, 4:] = 0
    ids[mask == 0] = 0
    return ids, types, mask


def test_pretraining_outputs_equal_hugging_face():
    ours, hf = _pair()
    ids, types, mask = _inputs()
    with torch.no_grad():
        ref = hf(input_ids=ids, token_type_ids=types, attention_mask=mask, output_hidden_states=True)
        out = ours(ids, types, mask, output_hidden_states=True)
    real = mask.bool()
    for a, b in zip(out.bert.hidden_states, ref.hidden_states):
        torch.testing.assert_close(a[real], b[real], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.mlm_logits[real], ref.prediction_logits[real], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.nsp_logits, ref.seq_relationship_logits, atol=1e-5, rtol=1e-5)


def test_model_pooled_and_attention_maps_equal_hugging_face():
    ours, hf = _pair(pretraining=False, attn="eager")
    ids, types, mask = _inputs(1)
    with torch.no_grad():
        ref = hf(input_ids=ids, token_type_ids=types, attention_mask=mask, output_attentions=True)
        out = ours(ids, types, mask.bool(), output_attentions=True)
    real = mask.bool()
    torch.testing.assert_close(out.last_hidden_state[real], ref.last_hidden_state[real], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.pooled, ref.pooler_output, atol=1e-5, rtol=1e-5)
    assert len(out.attentions) == SMALL["num_layers"]
    for a, b in zip(out.attentions, ref.attentions):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert float(out.attentions[0][2, :, :, 4:].abs().max()) == 0.0     # padding keys get no weight


def test_losses_equal_hugging_face_and_only_masked_gives_the_same_loss():
    ours, hf = _pair()
    ids, types, mask = _inputs(2)
    labels = torch.full_like(ids, -100)
    labels[0, 2], labels[1, 7], labels[3, 11] = 5, 9, 17
    nsp = torch.tensor([0, 1, 1, 0])
    with torch.no_grad():
        ref = hf(input_ids=ids, token_type_ids=types, attention_mask=mask, labels=labels, next_sentence_label=nsp)
        full = ours(ids, types, mask, mlm_labels=labels, nsp_labels=nsp)
        sparse = ours(ids, types, mask, mlm_labels=labels, nsp_labels=nsp, only_masked=True)
    torch.testing.assert_close(full.loss, ref.loss, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(sparse.loss, ref.loss, atol=1e-5, rtol=1e-5)
    assert sparse.mlm_logits.shape == (3, SMALL["vocab_size"])


def test_mlm_decoder_is_tied_to_the_token_embeddings():
    model = BertForPreTraining(BertConfig(**SMALL))
    assert model.mlm.decoder.weight is model.bert.embeddings.word_embeddings.weight
    n_tied = model.bert.embeddings.word_embeddings.weight.numel()
    assert model.num_parameters() == sum(p.numel() for p in model.parameters())
    assert model.num_parameters() < sum(p.numel() for _, p in model.named_parameters(remove_duplicate=False))
    assert (sum(p.numel() for _, p in model.named_parameters(remove_duplicate=False))
            - model.num_parameters()) == n_tied


@pytest.mark.parametrize("name,hf_kwargs", [
    ("BERT-base", {}),
    ("BERT-large", dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096)),
])
def test_published_parameter_counts_equal_hugging_face(name, hf_kwargs):
    with torch.device("meta"):                     # shapes only: no memory, no initialisation cost
        ours = BertModel(PUBLISHED[name])
        ref = transformers.BertModel(transformers.BertConfig(**hf_kwargs))
    assert ours.num_parameters() == ref.num_parameters()
    if name == "BERT-base":
        assert ours.num_parameters() == 109_482_240
        emb = 30522 * 768 + 512 * 768 + 2 * 768 + 2 * 768
        assert ours.num_parameters(exclude_embeddings=True) == 109_482_240 - emb


def test_copy_from_a_plain_hf_bert_model_state_dict():
    ours, hf = _pair(pretraining=False)
    state = hf.state_dict()
    fresh = BertModel(BertConfig(**SMALL, dropout=0.0, attention_dropout=0.0)).eval()
    load_hf_bert(fresh, state)
    for k, v in ours.state_dict().items():
        torch.testing.assert_close(fresh.state_dict()[k], v)
    with pytest.raises(WeightCopyError, match="no source|never uses|shape"):
        load_hf_bert(BertModel(BertConfig(**{**SMALL, "num_layers": 2})), state)
    with pytest.raises(ValueError, match="pre-training heads"):
        load_hf_bert(BertForPreTraining(BertConfig(**SMALL)), state)


def test_segment_ids_and_padding_matter():
    ours, _ = _pair(pretraining=False)
    ids, types, mask = _inputs(3)
    with torch.no_grad():
        a = ours(ids, types, mask).last_hidden_state
        b = ours(ids, torch.zeros_like(types), mask).last_hidden_state
        c = ours(ids, types, None).last_hidden_state
    assert not torch.allclose(a, b)
    torch.testing.assert_close(a[0], c[0])            # row 0 has no padding
    assert not torch.allclose(a[1, :9], c[1, :9])      # row 1 does: hiding it changes the real tokens


def test_sequence_classifier_trains_every_weight():
    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(**SMALL), num_labels=3)
    ids, types, mask = _inputs(4)
    logits = model(ids, types, mask)
    assert logits.shape == (4, 3)
    torch.nn.functional.cross_entropy(logits, torch.tensor([0, 1, 2, 0])).backward()
    no_grad = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    # only the padding row of the token embedding can be without gradient, never a whole tensor
    assert no_grad == [], no_grad


def test_bad_inputs_give_clear_errors():
    model = BertModel(BertConfig(**SMALL))
    ids = torch.randint(0, SMALL["vocab_size"], (2, 5))
    with pytest.raises(TypeError, match="input_ids must be an integer tensor"):
        model(ids.float())
    with pytest.raises(ValueError, match=r"input_ids must be ids in \[0, 61\)"):
        model(ids + 100)
    with pytest.raises(ValueError, match="max_position=24"):
        model(torch.zeros(1, 25, dtype=torch.long))
    with pytest.raises(ValueError, match=r"token_type_ids must be ids in \[0, 2\)"):
        model(ids, torch.full_like(ids, 2))
    with pytest.raises(ValueError, match="attention_mask must have the shape"):
        model(ids, None, torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="only 0"):
        model(ids, None, torch.full_like(ids, 2))
    with pytest.raises(TypeError, match="bool or 0/1"):
        model(ids, None, torch.ones(2, 5))
    with pytest.raises(ValueError, match="not divisible"):
        BertConfig(hidden_size=30, num_heads=4)
    with pytest.raises(ValueError, match="dropout"):
        BertConfig(dropout=1.0)
    with pytest.raises(TypeError, match="BertConfig"):
        BertModel(dict(SMALL))


def test_mean_pooling_classifier_ignores_padding_and_has_no_pooler():
    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(**SMALL, dropout=0.0, attention_dropout=0.0),
                                          pooling="mean").eval()
    assert model.bert.pooler is None
    ids, types, mask = _inputs(5)
    longer = torch.cat([ids, torch.zeros(4, 3, dtype=torch.long)], dim=1)     # three more padding positions
    with torch.no_grad():
        a = model(ids, types, mask)
        b = model(longer, torch.cat([types, torch.ones(4, 3, dtype=torch.long)], 1),
                  torch.cat([mask, torch.zeros(4, 3, dtype=torch.long)], 1))
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="pooling"):
        BertForSequenceClassification(BertConfig(**SMALL), pooling="max")
