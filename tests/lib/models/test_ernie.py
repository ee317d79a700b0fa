"""ERNIE: knowledge masking (basic / phrase / entity), the dialogue data with Q/R roles,
and the model against Hugging Face's ErnieModel."""
from __future__ import annotations

import math

import pytest
import torch

from lib.data import dialogue as dlg
from lib.data import knowledge_masking as km
from lib.data.knowledge_masking import Morpheme as M


# ----------------------------------------------------------------------------- CJK spacing

def test_space_cjk_spaces_ideographs_only():
    assert km.space_cjk("王추천") == "王 추천"
    assert km.space_cjk("신호탄.王王 추천") == "신호탄. 王 王 추천"
    assert km.space_cjk("영화 최고") == "영화 최고"                   # Hangul untouched
    assert km.space_cjk("カメラ漢字") == "カメラ 漢 字"                 # kana is not an ideograph
    assert km.is_cjk("漢") and not km.is_cjk("한") and not km.is_cjk("a")
    with pytest.raises(TypeError, match="text"):
        km.space_cjk(3)
    with pytest.raises(TypeError, match="single character"):
        km.is_cjk("ab")


# ----------------------------------------------------------------------------- phrases and entities

def morphs(*items):
    """Morphemes from (form, tag, start) triples."""
    return [M(f, t, s, s + len(f)) for f, t, s in items]


# "이 영화 정말 재미있다 송강호 연기 최고"
SENT1 = morphs(("이", "MM", 0), ("영화", "NNG", 2), ("정말", "MAG", 5), ("재미있", "VA", 8), ("다", "EF", 11),
               ("송강호", "NNP", 13), ("연기", "NNG", 17), ("최고", "NNG", 20))
# "영화를 보고 싶다. 해리 포터!"
SENT2 = morphs(("영화", "NNG", 0), ("를", "JKO", 2), ("보", "VV", 4), ("고", "EC", 5), ("싶", "VX", 7),
               ("다", "EF", 8), (".", "SF", 9), ("해리", "NNP", 11), ("포터", "NNP", 14), ("!", "SF", 16))


def test_phrase_rule_on_analysed_sentences():
    text1 = "이 영화 정말 재미있다 송강호 연기 최고"
    assert [text1[a:b] for a, b in km.phrase_spans(SENT1)] == ["이 영화", "정말 재미있다", "송강호 연기 최고"]
    text2 = "영화를 보고 싶다. 해리 포터!"
    assert [text2[a:b] for a, b in km.phrase_spans(SENT2)] == ["영화를", "보고 싶다", "해리 포터"]
    # a nominal after an adnominal ending joins it; a bound noun takes its predicate
    text3 = "보일 수 있다"
    sent3 = [M("보이", "VV", 0, 2), M("ᆯ", "ETM", 1, 2), M("수", "NNB", 3, 4), M("있", "VA", 5, 6),
             M("다", "EF", 6, 7)]
    assert [text3[a:b] for a, b in km.phrase_spans(sent3)] == ["보일 수 있다"]
    # phrases never overlap and a lone particle makes none
    assert km.phrase_spans([M("은", "JX", 0, 1)]) == []
    # contracted forms: a morpheme starting inside the previous one, or of length 0
    odd = [M("재미있", "VA", 0, 3), M("다고", "EC", 3, 4), M("하", "VV", 4, 4), M("했", "VV", 5, 6),
           M("어", "EF", 4, 6), M("영화", "NNP", 7, 9), M("감독", "NNP", 8, 10)]
    spans = km.phrase_spans(odd)
    assert spans == sorted(spans) and all(a < b for a, b in spans)
    assert all(b1 <= a2 for (_, b1), (a2, _) in zip(spans, spans[1:]))            # no overlap
    assert km.entity_spans(odd) == [(7, 10)]
    with pytest.raises(ValueError, match="invalid span"):
        km.phrase_spans([M("b", "NNG", 5, 4)])
    with pytest.raises(TypeError, match="Morpheme"):
        km.phrase_spans([("영화", "NNG", 0, 2)])


def test_entities_are_runs_of_proper_nouns():
    assert km.entity_spans(SENT1) == [(13, 16)]
    assert km.entity_spans(SENT2) == [(11, 16)]                       # 해리 포터, one entity over a space
    assert km.entity_spans(SENT2, max_gap=0) == [(11, 13), (14, 16)]
    # two names separated by a common noun stay apart
    sent = morphs(("봉준호", "NNP", 0), ("감독", "NNG", 4), ("송강호", "NNP", 7))
    assert km.entity_spans(sent) == [(0, 3), (7, 10)]


@pytest.fixture(scope="module")
def chunker():
    pytest.importorskip("kiwipiepy")
    return km.KoreanChunker()


def test_kiwi_analysis_gives_phrases_and_entities(chunker):
    text = "봉준호 감독의 기생충은 칸 영화제에서 황금종려상을 받았다"
    phrases = [text[a:b] for a, b in chunker.phrases(text)]
    assert "칸 영화제에서" in phrases and "황금종려상을" in phrases
    assert [text[a:b] for a, b in chunker.entities(text)][0] == "봉준호"


# ----------------------------------------------------------------------------- to tokens

def test_token_spans_take_whole_tokens_and_merge():
    offsets = [(0, 2), (2, 4), (5, 7), (8, 10)]                       # "영화 제에 서울 최고" as 4 tokens
    assert km.token_spans(offsets, [(1, 3)]) == [(0, 2)]               # inside two tokens: both
    assert km.token_spans(offsets, [(0, 2), (5, 10)], shift=1) == [(1, 2), (3, 5)]
    assert km.token_spans(offsets, [(0, 3), (3, 4)]) == [(0, 2)]       # share token 1: merged
    assert km.token_spans(offsets, [(20, 30)]) == []                   # truncated away
    with pytest.raises(ValueError, match="empty or reversed"):
        km.token_spans(offsets, [(3, 3)])


@pytest.fixture(scope="module")
def tokenizer():
    from lib.text import train_tokenizer

    texts = ["이 영화 정말 재미있다 송강호 연기 최고", "영화를 보고 싶다. 해리 포터!", "王추천 영화",
             "봉준호 감독의 기생충은 칸 영화제에서 황금종려상을 받았다", "12시 땡!", "하루가 또 가네요."] * 5
    return train_tokenizer(texts, kind="wordpiece", vocab_size=200, min_frequency=1)


def test_prepare_aligns_spans_with_wordpiece(tokenizer, chunker):
    text = "이 영화 정말 재미있다 송강호 연기 최고 王추천"
    (ex,) = km.prepare([text], tokenizer, chunker, max_len=64)
    assert ex.ids[0] == tokenizer.cls_id and ex.ids[-1] == tokenizer.sep_id
    assert "王 추천" in ex.text                                        # CJK spaced before WordPiece
    i, j = ex.entities[0]
    assert tokenizer.decode(ex.ids[i:j]).replace(" ", "") == "송강호"
    for i, j in ex.phrases:
        assert 1 <= i < j <= len(ex.ids) - 1
    decoded = [tokenizer.decode(ex.ids[i:j]).replace(" ", "") for i, j in ex.phrases]
    assert "정말재미있다" in decoded and "이영화" in decoded
    # truncation keeps [SEP] and drops spans past the cut
    (short,) = km.prepare([text], tokenizer, chunker, max_len=5)
    assert len(short.ids) == 5 and short.ids[-1] == tokenizer.sep_id
    assert all(j <= 4 for _, j in short.phrases + short.entities)


# ----------------------------------------------------------------------------- masking

def example(n=21, phrases=((1, 4), (6, 9), (12, 15)), entities=((6, 8),)):
    return km.KnowledgeExample(ids=[4] + list(range(10, 10 + n - 2)) + [5],
                               phrases=list(phrases), entities=list(entities))


def test_units_cover_every_inner_token_once():
    ex = example()
    for level in km.LEVELS:
        units = km.units_for(ex, level)
        covered = [t for i, j in units for t in range(i, j)]
        assert sorted(covered) == list(range(1, len(ex.ids) - 1))     # never [CLS] / [SEP], no repeats
    assert (1, 4) in km.units_for(ex, "phrase") and (6, 8) in km.units_for(ex, "entity")
    assert all(j - i == 1 for i, j in km.units_for(ex, "basic"))
    with pytest.raises(ValueError, match="level"):
        km.units_for(ex, "word")
    with pytest.raises(ValueError, match="between"):
        km.units_for(km.KnowledgeExample(ids=[4, 10, 5], phrases=[(0, 2)]), "phrase")


@pytest.mark.parametrize("level", km.LEVELS)
def test_knowledge_mask_hides_whole_units_and_a_fixed_number_of_tokens(level):
    ex = example()
    n = len(ex.ids) - 2
    units = km.units_for(ex, level)
    gen = torch.Generator().manual_seed(0)
    saw_partial_phrase = False
    mask_counts = []
    for _ in range(300):
        inputs, labels = km.knowledge_mask(ex, level, mask_id=6, vocab_size=100, generator=gen)
        chosen = labels != km.IGNORE_INDEX
        assert int(chosen.sum()) == round(0.15 * n)                     # the same budget at every level
        assert torch.equal(labels[chosen], torch.tensor(ex.ids)[chosen])
        assert not chosen[0] and not chosen[-1]
        assert torch.equal(inputs[~chosen], torch.tensor(ex.ids)[~chosen])
        for i, j in units:                                             # a unit is all in or all out
            assert chosen[i:j].all() or not chosen[i:j].any()
            saw_partial_phrase |= bool(chosen[i:j].any() and not chosen[i:j].all())
        mask_counts += (inputs[chosen] == 6).tolist()
    assert not saw_partial_phrase
    frac = sum(mask_counts) / len(mask_counts)
    assert 0.75 < frac < 0.85                                          # 80 % of the chosen tokens become [MASK]


def test_phrase_level_masks_phrases_together_often():
    ex = example()
    gen = torch.Generator().manual_seed(1)
    whole = 0
    for _ in range(200):
        _, labels = km.knowledge_mask(ex, "phrase", mask_id=6, vocab_size=100, generator=gen)
        whole += bool((labels[1:4] != -100).all())
    assert whole >= 8                                                  # a 3-token phrase is chosen whole (1 in 13)
    gen = torch.Generator().manual_seed(1)
    together = 0
    for _ in range(200):
        _, labels = km.knowledge_mask(ex, "basic", mask_id=6, vocab_size=100, generator=gen)
        together += bool((labels[1:4] != -100).all())
    assert together <= 2                                               # basic: all three 1 in 969


def test_mask_units_replacements_and_errors():
    gen = torch.Generator().manual_seed(0)
    ids = [4] + [50] * 40 + [5]
    units = [(t, t + 1) for t in range(1, 41)]
    seen_random = seen_kept = False
    for _ in range(100):
        inputs, labels = km.mask_units(ids, units, mask_id=6, vocab_size=60, generator=gen)
        chosen = labels != -100
        rep = inputs[chosen]
        assert ((rep == 6) | (rep == 50) | ((rep >= 7) & (rep < 60))).all()
        seen_random |= bool(((rep != 6) & (rep != 50)).any())
        seen_kept |= bool((rep == 50).any())
    assert seen_random and seen_kept
    one = km.mask_units([4, 9, 9, 9, 9, 5], [(1, 5)], mask_id=6, vocab_size=60, generator=gen)[1]
    assert int((one != -100).sum()) == 1                               # a phrase over budget: one token still
    with pytest.raises(ValueError, match="outside"):
        km.mask_units([4, 9, 5], [(2, 5)], mask_id=6, vocab_size=60)
    with pytest.raises(ValueError, match="mask_prob"):
        km.select_units([(1, 2)], 1, mask_prob=1.5)


# ----------------------------------------------------------------------------- dialogues

PAIRS = [{"q": f"질문 {i}", "a": f"대답 {i}"} for i in range(200)]


def test_dialogues_real_and_fake():
    ds = dlg.make_dialogues(PAIRS, seed=0)
    assert len(ds) == len(PAIRS)
    labels = [d.label for d in ds]
    assert set(labels) == {dlg.REAL, dlg.FAKE} and 0.35 < labels.count(dlg.FAKE) / len(labels) < 0.65
    replaced = {"Q": 0, "R": 0}
    for d, p in zip(ds, PAIRS):
        assert [r for r, _ in d.turns] == ["Q", "R"]
        (_, q), (_, a) = d.turns
        if d.label == dlg.REAL:
            assert (q, a) == (p["q"], p["a"])
        else:
            assert (q == p["q"]) != (a == p["a"])                      # exactly one turn replaced
            replaced["Q" if q != p["q"] else "R"] += 1
            assert (q, a) not in {(x["q"], x["a"]) for x in PAIRS}
    assert min(replaced.values()) > 10
    assert ds == dlg.make_dialogues(PAIRS, seed=0) and ds != dlg.make_dialogues(PAIRS, seed=1)
    with pytest.raises(ValueError, match="at least 2"):
        dlg.make_dialogues(PAIRS[:1])


def test_split_pairs_by_question():
    train, test = dlg.split_pairs(PAIRS + [{"q": "질문 0", "a": "다른 대답"}])
    assert len(train) + len(test) == len(PAIRS) + 1 and 0 < len(test) < len(PAIRS) / 4
    assert {p["q"] for p in train}.isdisjoint({p["q"] for p in test})
    with pytest.raises(ValueError, match="keys q and a"):
        dlg.split_pairs([{"question": "x"}])


def test_encode_dialogue_roles_follow_turns(tokenizer):
    enc = dlg.encode_dialogue((("Q", "12시 땡!"), ("R", "하루가 또 가네요.")), tokenizer, max_len=64)
    q = tokenizer.encode("12시 땡!")
    r = tokenizer.encode("하루가 또 가네요.")
    assert enc.ids == [tokenizer.cls_id, *q, tokenizer.sep_id, *r, tokenizer.sep_id]
    assert enc.roles == [0] * (len(q) + 2) + [1] * (len(r) + 1)
    # three turns (ERNIE's QRQ): each turn's tokens and its [SEP] carry its role
    enc3 = dlg.encode_dialogue((("Q", "12시 땡!"), ("R", "하루가 또 가네요."), ("Q", "12시 땡!")), tokenizer)
    assert enc3.roles == [0] * (len(q) + 2) + [1] * (len(r) + 1) + [0] * (len(q) + 1)
    short = dlg.encode_dialogue((("Q", "하루가 또 가네요. " * 5), ("R", "하루가 또 가네요.")), tokenizer, max_len=12)
    assert len(short.ids) <= 12 and short.ids.count(tokenizer.sep_id) == 2 and 1 in short.roles
    with pytest.raises(ValueError, match="role 'Q' or 'R'"):
        dlg.encode_dialogue((("A", "x"),), tokenizer)


# ----------------------------------------------------------------------------- the model

from lib.models import ernie as E  # noqa: E402
from lib.models.reference import randomise

TINY = dict(vocab_size=97, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64, max_position=40)


def hf_pair(pretraining: bool, use_task_id: bool = True, seed: int = 0):
    transformers = pytest.importorskip("transformers")
    hf_cfg = transformers.ErnieConfig(
        vocab_size=TINY["vocab_size"], hidden_size=TINY["hidden_size"], num_hidden_layers=TINY["num_layers"],
        num_attention_heads=TINY["num_heads"], intermediate_size=TINY["intermediate_size"],
        max_position_embeddings=TINY["max_position"], type_vocab_size=2, use_task_id=use_task_id,
        task_type_vocab_size=3, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(seed)
    cls = transformers.ErnieForPreTraining if pretraining else transformers.ErnieModel
    theirs = cls(hf_cfg).eval()
    randomise(theirs, seed=seed, only=r"LayerNorm|bias$")     # non-trivial LayerNorms and biases, so a swap shows
    cfg = E.ErnieConfig.from_hf(hf_cfg)
    assert cfg.use_task_id == use_task_id and cfg.dropout == 0.0
    ours = (E.ErnieForPreTraining(cfg) if pretraining else E.ErnieModel(cfg)).eval()
    E.load_hf_ernie(ours, theirs)
    return ours, theirs


def inputs(seed=0, B=3, T=11):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, TINY["vocab_size"], (B, T), generator=g)
    types = torch.randint(0, 2, (B, T), generator=g)
    tasks = torch.randint(0, 3, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, 7:] = 0
    return ids, types, tasks, mask


def test_model_equals_hugging_face_ernie_with_task_embeddings():
    ours, theirs = hf_pair(pretraining=False)
    ids, types, tasks, mask = inputs()
    with torch.no_grad():
        a = ours(ids, types, mask, task_type_ids=tasks)
        b = theirs(input_ids=ids, token_type_ids=types, task_type_ids=tasks, attention_mask=mask)
        real = mask.bool()
        assert torch.allclose(a.last_hidden_state[real], b.last_hidden_state[real], atol=1e-5)
        assert torch.allclose(a.pooled, b.pooler_output, atol=1e-5)
        # the task embedding is used: other task ids change the output, in both models alike
        c = ours(ids, types, mask, task_type_ids=(tasks + 1) % 3)
        d = theirs(input_ids=ids, token_type_ids=types, task_type_ids=(tasks + 1) % 3, attention_mask=mask)
        assert not torch.allclose(a.pooled, c.pooled, atol=1e-3)
        assert torch.allclose(c.pooled, d.pooler_output, atol=1e-5)
        # omitted task ids are zeros, as in Hugging Face
        assert torch.allclose(ours(ids, types, mask).pooled,
                              theirs(input_ids=ids, token_type_ids=types, attention_mask=mask).pooler_output, atol=1e-5)


def test_pretraining_heads_equal_hugging_face():
    ours, theirs = hf_pair(pretraining=True)
    ids, types, tasks, mask = inputs(seed=1)
    labels = torch.full_like(ids, -100)
    labels[:, 2] = ids[:, 2]
    nsp = torch.tensor([dlg.REAL, dlg.FAKE, dlg.REAL])
    with torch.no_grad():
        a = ours(ids, types, mask, mlm_labels=labels, nsp_labels=nsp, task_type_ids=tasks)
        b = theirs(input_ids=ids, token_type_ids=types, task_type_ids=tasks, attention_mask=mask,
                   labels=labels, next_sentence_label=nsp)
    assert torch.allclose(a.mlm_logits, b.prediction_logits, atol=1e-4)
    assert torch.allclose(a.nsp_logits, b.seq_relationship_logits, atol=1e-5)
    assert torch.allclose(a.loss, b.loss, atol=1e-5)
    assert ours.mlm.decoder.weight is ours.bert.word_embeddings.weight       # tied


def test_without_task_ids_it_is_bert_and_parameter_counts_match():
    transformers = pytest.importorskip("transformers")
    ours, theirs = hf_pair(pretraining=False, use_task_id=False, seed=3)
    assert ours.embeddings.task_type_embeddings is None
    assert ours.num_parameters() == sum(p.numel() for p in theirs.parameters())
    with_task = E.ErnieModel(E.ErnieConfig(**TINY, use_task_id=True))
    assert with_task.num_parameters() - ours.num_parameters() == 3 * TINY["hidden_size"]
    ids, types, _, mask = inputs(seed=2)
    with torch.no_grad():
        assert torch.allclose(ours(ids, types, mask).pooled,
                              theirs(input_ids=ids, token_type_ids=types, attention_mask=mask).pooler_output, atol=1e-5)
    del transformers


def test_roles_enter_through_the_segment_table():
    """Role ids index the segment (token-type) table, added to the token embedding."""
    torch.manual_seed(0)
    model = E.ErnieModel(E.ErnieConfig(**TINY, dropout=0.0, attention_dropout=0.0)).eval()
    emb = model.embeddings
    ids = torch.tensor([[4, 20, 21, 5, 30, 5]])
    roles = torch.tensor([[0, 0, 0, 0, 1, 1]])
    pos = emb.position_embeddings.weight[:6]
    want = emb.norm(emb.word_embeddings(ids) + emb.token_type_embeddings(roles) + pos)
    assert torch.allclose(emb(ids, roles), want, atol=1e-6)
    with torch.no_grad():
        flipped = model(ids, 1 - roles).last_hidden_state
        assert not torch.allclose(model(ids, roles).last_hidden_state, flipped, atol=1e-4)


def test_ernie_bad_inputs():
    model = E.ErnieModel(E.ErnieConfig(**TINY))
    ids = torch.tensor([[4, 20, 5]])
    with pytest.raises(ValueError, match="no task embedding"):
        model(ids, task_type_ids=torch.zeros_like(ids))
    with_task = E.ErnieModel(E.ErnieConfig(**TINY, use_task_id=True))
    with pytest.raises(ValueError, match="task_type_ids"):
        with_task(ids, task_type_ids=torch.full_like(ids, 3))
    with pytest.raises(TypeError, match="ErnieConfig"):
        E.ErnieModel(E.BertConfig(**TINY))
    with pytest.raises(TypeError, match="use_task_id"):
        E.ErnieConfig(**TINY, use_task_id="yes")


def test_collate_pads_and_masks_per_level():
    exs = [example(), example(n=9, phrases=((1, 4),), entities=())]
    b = km.collate(exs, ["phrase", "basic"], mask_id=6, vocab_size=100, pad_id=0,
                   generator=torch.Generator().manual_seed(0))
    assert b["input_ids"].shape == b["mlm_labels"].shape == b["attention_mask"].shape == (2, 21)
    assert b["attention_mask"][1].tolist() == [True] * 9 + [False] * 12
    assert (b["input_ids"][1, 9:] == 0).all() and (b["mlm_labels"][1, 9:] == -100).all()
    assert int((b["mlm_labels"][0] != -100).sum()) == round(0.15 * 19)
    assert int((b["mlm_labels"][1] != -100).sum()) == 1                  # round(0.15 * 7) = 1
    with pytest.raises(ValueError, match="levels has 1"):
        km.collate(exs, ["basic"], mask_id=6, vocab_size=100)


def test_collate_dialogues_roles_labels_and_masking(tokenizer):
    ds = dlg.make_dialogues(PAIRS[:40], seed=0)
    encoded = [dlg.encode_dialogue(d.turns, tokenizer, label=d.label) for d in ds]
    b = dlg.collate_dialogues(encoded, mask_id=tokenizer.mask_id, vocab_size=tokenizer.vocab_size,
                              special_ids=[tokenizer.pad_id, tokenizer.cls_id, tokenizer.sep_id],
                              pad_id=tokenizer.pad_id, generator=torch.Generator().manual_seed(0))
    assert b["nsp_labels"].tolist() == [d.label for d in ds]
    for k, e in enumerate(encoded):
        n = len(e.ids)
        assert b["token_type_ids"][k, :n].tolist() == e.roles                # roles, as segment ids
        assert (b["token_type_ids"][k, n:] == 0).all() and not b["attention_mask"][k, n:].any()
        chosen = b["mlm_labels"][k] != -100
        assert chosen.any() and not chosen[n:].any()
        original = torch.tensor(e.ids)
        assert not (chosen[:n] & ((original == tokenizer.cls_id) | (original == tokenizer.sep_id))).any()
        assert torch.equal(b["mlm_labels"][k][chosen], original[chosen[:n]])


def test_fakes_from_other_text():
    sentences = [f"리뷰 문장 {i}" for i in range(50)]
    ds = dlg.make_dialogues(PAIRS, seed=0, sentences=sentences)
    fakes = [d for d in ds if d.label == dlg.FAKE]
    sources = [d.fake_from for d in fakes]
    assert set(sources) == {"text", "dialogue"} and all(d.fake_from is None for d in ds if d.label == dlg.REAL)
    for d in fakes:
        texts = [t for _, t in d.turns]
        assert any(t in sentences for t in texts) == (d.fake_from == "text")
    assert all(d.fake_from == "dialogue" for d in dlg.make_dialogues(PAIRS, seed=0) if d.label == dlg.FAKE)


def test_unit_index_and_units_from_index_round_trip():
    index = km.unit_index(7, [(1, 3), (4, 7)], first=10)
    assert index == [-1, 10, 10, -1, 11, 11, 11]
    maskable = [True] * 7
    assert km.units_from_index(index, maskable) == [(0, 1), (1, 3), (3, 4), (4, 7)]
    # a special token (a separator) splits nothing into a unit and is never in one
    maskable[5] = False
    assert km.units_from_index(index, maskable) == [(0, 1), (1, 3), (3, 4), (4, 5), (6, 7)]
    # a span cut by the sequence's edge keeps the part inside
    assert km.units_from_index(index[2:], [True] * 5) == [(0, 1), (1, 2), (2, 5)]
    with pytest.raises(ValueError, match="overlaps"):
        km.unit_index(5, [(0, 3), (2, 4)])
    with pytest.raises(ValueError, match="outside"):
        km.unit_index(3, [(1, 4)])
    with pytest.raises(ValueError, match="maskable 2"):
        km.units_from_index([-1, -1, -1], [True, True])


def test_cloze_items_draw_one_whole_unit_per_example_and_scores_count_right_tokens():
    ex = [km.KnowledgeExample(ids=[2, 10, 11, 12, 13, 3], phrases=[(1, 3), (3, 4)], entities=[(2, 5)]),
          km.KnowledgeExample(ids=[2, 20, 21, 3], phrases=[(1, 2)], entities=[]),
          km.KnowledgeExample(ids=[2, 30, 31, 32, 3], phrases=[(1, 4)], entities=[(1, 3)])]
    phrase = km.cloze_items(ex, "phrase", seed=0)
    assert [it.span for it in phrase] == [(1, 3), (1, 4)]             # only units of 2 tokens or more
    assert km.cloze_items(ex, "phrase", seed=5) == km.cloze_items(ex, "phrase", seed=5)
    assert [it.span for it in km.cloze_items(ex, "entity")] == [(2, 5), (1, 3)]
    basic = km.cloze_items(ex, "basic", seed=1)
    assert len(basic) == 3 and all(it.span[1] - it.span[0] == 1 and 1 <= it.span[0] < len(it.ids) - 1
                                   for it in basic)
    mask_id, vocab = 4, 40

    def oracle(wrong: set[int]):      # restores every hidden token except the ids in ``wrong``
        seen = []

        def fn(inputs, attention, hidden):
            batch = phrase[len(seen):len(seen) + len(inputs)]
            seen.extend(batch)
            truth = torch.zeros(inputs.shape, dtype=torch.long)
            for b, it in enumerate(batch):
                truth[b, :len(it.ids)] = torch.tensor(it.ids)
                i, j = it.span
                assert (inputs[b, i:j] == mask_id).all() and attention[b, :len(it.ids)].all()
            truth[torch.isin(truth, torch.tensor(sorted(wrong) or [-1]))] = 5
            return torch.nn.functional.one_hot(truth, vocab).float()[hidden]
        return fn

    perfect = km.cloze_scores(oracle(set()), phrase, mask_id=mask_id)
    assert perfect["tokens"] == [1.0, 1.0] and perfect["whole"] == [1.0, 1.0]
    # one-hot logits: a right token costs log(V - 1 + e) - 1 nats, a wrong one log(V - 1 + e)
    right, wrong = math.log(vocab - 1 + math.e) - 1, math.log(vocab - 1 + math.e)
    assert perfect["nll"] == pytest.approx([right, right])
    scores = km.cloze_scores(oracle({11, 31}), phrase, mask_id=mask_id, batch_size=1)
    assert scores["tokens"] == pytest.approx([0.5, 2 / 3]) and scores["whole"] == [0.0, 0.0]
    assert scores["nll"] == pytest.approx([(right + wrong) / 2, (2 * right + wrong) / 3])
    with pytest.raises(ValueError, match="items is empty"):
        km.cloze_scores(oracle(set()), [], mask_id=mask_id)
    with pytest.raises(ValueError, match="hidden positions only"):
        km.cloze_scores(lambda x, a, h: torch.zeros(*x.shape, vocab), phrase, mask_id=mask_id)
