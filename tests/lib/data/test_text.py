"""lib.text: subword tokenizers, word vocabularies, padding and batching."""
import json
import unicodedata

import numpy as np
import pytest
import torch

from lib import text as T

KOREAN = [
    "영화 볼래?", "오늘 영화 볼래?", "주말에 같이 영화 볼래?", "나는 그 영화가 정말 좋았어.",
    "배우들의 연기가 좋았어!", "이 영화는 지루했어.", "내일 같이 밥 먹을래?", "오늘 날씨가 정말 좋다.",
    "그 배우 연기 진짜 잘한다!", "다음 주에 영화관 갈래?", "영화관에서 팝콘 먹자.", "정말 재밌는 영화였어.",
]
ENGLISH = [
    "Do you want to watch a movie?", "I really liked that movie.", "The actors were great!",
    "This movie was boring.", "Shall we eat together tomorrow?", "The weather is really nice today.",
    "Let's go to the cinema next week.", "What a fun movie, really!", "I want popcorn, please.",
    "We watched the movie together.", "Do you like the actors?", "The movie was really fun.",
]
CORPUS = (KOREAN + ENGLISH) * 4
# sentences whose characters all occur in CORPUS
ROUND_TRIP = ["영화 볼래?", "오늘 같이 영화 볼래?", "배우 연기가 정말 좋았어!",
              "Do you want to watch a movie?", "I really liked the actors, really!", "The movie was boring."]


@pytest.fixture(scope="module")
def bpe():
    return T.train_tokenizer(CORPUS, kind="bpe", vocab_size=300)


@pytest.fixture(scope="module")
def wordpiece():
    return T.train_tokenizer(CORPUS, kind="wordpiece", vocab_size=300)


# ----------------------------------------------------------------------------- special tokens

@pytest.mark.parametrize("kind", ["bpe", "wordpiece"])
def test_special_tokens_have_fixed_ids(kind, bpe, wordpiece):
    tok = bpe if kind == "bpe" else wordpiece
    assert list(T.SPECIAL_TOKENS) == ["pad", "unk", "bos", "eos", "cls", "sep", "mask"]
    for i, (name, token) in enumerate(T.SPECIAL_TOKENS.items()):
        assert tok.hf.token_to_id(token) == i
        assert getattr(tok, f"{name}_id") == i
        assert T.SPECIAL_IDS[name] == i


def test_word_vocab_shares_special_ids():
    v = T.WordVocab.build([["a", "b"]])
    assert v.itos[:7] == list(T.SPECIAL_TOKENS.values())
    assert (v.pad_id, v.unk_id, v.bos_id, v.eos_id) == (0, 1, 2, 3)


# ----------------------------------------------------------------------------- round trips

@pytest.mark.parametrize("s", ROUND_TRIP)
def test_bpe_round_trip_korean_and_english(bpe, s):
    ids = bpe.encode(s)
    assert bpe.unk_id not in ids
    assert bpe.decode(ids) == bpe.normalize(s) == s


@pytest.mark.parametrize("s", ["영화 볼래?", "오늘 영화 볼래?", "I really liked that movie.",
                               "The actors were great!", "I want popcorn, please."])
def test_wordpiece_round_trip(wordpiece, s):
    ids = wordpiece.encode(s)
    assert wordpiece.unk_id not in ids
    assert wordpiece.decode(ids) == s


def test_bpe_korean_tokens_are_readable_pieces_of_the_text(bpe):
    s = "주말에 같이 영화 볼래?"
    toks = bpe.tokens(s)
    # character level, not byte level: every token is a piece of the text with ▁ for spaces
    assert "".join(toks) == "▁" + s.replace(" ", "▁").replace("▁?", "?")
    assert all(any("\uac00" <= ch <= "\ud7a3" for ch in t) for t in toks if t not in ("?", "▁"))
    # a frequent word becomes one token
    assert "▁영화" in toks


def test_wordpiece_marks_continuations(wordpiece):
    # "영화관에" and "팝콘을" never occur whole: known words plus ## continuation pieces
    toks = wordpiece.tokens("영화관에 팝콘을")
    assert toks[0] == "영화관" and toks[1].startswith("##")
    words, word = [], ""
    for t in toks:  # glue the pieces back into words
        if t.startswith("##"):
            word += t[2:]
        else:
            words.append(word) if word else None
            word = t
    words.append(word)
    assert words == ["영화관에", "팝콘을"]
    assert wordpiece.decode(wordpiece.encode("영화관에 팝콘을")) == "영화관에 팝콘을"


def test_normalization_nfc_whitespace_and_lowercase():
    tok = T.train_tokenizer(CORPUS, kind="bpe", vocab_size=200, lowercase=True)
    s = "  MOVIE   was\tfun  "
    assert tok.normalize(s) == "movie was fun"
    assert tok.decode(tok.encode(s)) == "movie was fun"
    # decomposed Hangul (as some macOS files have it) is composed into syllables
    decomposed = unicodedata.normalize("NFD", "영화 볼래?")
    assert len(decomposed) > len("영화 볼래?")
    assert tok.normalize(decomposed) == "영화 볼래?"
    assert tok.encode(decomposed) == tok.encode("영화 볼래?")
    cased = T.train_tokenizer(CORPUS, kind="bpe", vocab_size=200)
    assert cased.normalize("The Movie") == "The Movie"
    assert cased.encode("The") != cased.encode("the")


@pytest.mark.parametrize("kind", ["bpe", "wordpiece"])
def test_stand_alone_jamo_survive(kind):
    # Korean reviews are full of ㅋㅋ and ㅠㅠ; NFKC would turn "ㅋㅠ" into the syllable "큐"
    texts = ["ㅋㅋㅋ 재밌다", "ㅠㅠ 슬프다", "ㅋㅠㅠ 뭐지", "ㅎㅎ 좋아"] * 3
    tok = T.train_tokenizer(texts, kind=kind, vocab_size=100)
    for s in texts[:4]:
        assert tok.normalize(s) == s
        assert tok.decode(tok.encode(s)) == s
    assert T.simple_tokenize("ㅋㅠㅠ 뭐지?") == ["ㅋㅠㅠ", "뭐지", "?"]


def test_unseen_character_becomes_unk(bpe):
    ids = bpe.encode("영화 볼래 😀")
    assert bpe.unk_id in ids
    assert bpe.decode(ids[:2]) == "영화 볼래"


def test_add_bos_eos_and_decode_specials(bpe):
    plain = bpe.encode("영화 볼래?")
    wrapped = bpe.encode("영화 볼래?", add_bos_eos=True)
    assert wrapped == [bpe.bos_id, *plain, bpe.eos_id]
    padded = wrapped + [bpe.pad_id] * 3
    assert bpe.decode(padded) == "영화 볼래?"
    shown = bpe.decode(padded, skip_special=False)
    assert shown.startswith("[BOS]") and shown.endswith("[PAD]") and "영화 볼래?" in shown
    assert bpe.decode(torch.tensor(padded)) == "영화 볼래?"
    assert bpe.decode(np.array(padded)) == "영화 볼래?"


def test_encode_batch_matches_encode(bpe):
    texts = KOREAN[:3] + ENGLISH[:3]
    assert bpe.encode_batch(texts) == [bpe.encode(t) for t in texts]
    assert bpe.encode_batch(texts, add_bos_eos=True) == [bpe.encode(t, add_bos_eos=True) for t in texts]


def test_decode_batch_and_token_lookup(bpe):
    texts = ["영화 볼래?", "The movie was boring."]
    ids = bpe.encode_batch(texts, add_bos_eos=True)
    batch, _ = T.pad_batch(ids, bpe.pad_id)
    assert bpe.decode_batch(batch) == texts
    assert bpe.decode_batch(ids) == texts
    pieces = [bpe.id_to_token(i) for i in bpe.encode("영화 볼래?")]
    assert pieces == bpe.tokens("영화 볼래?")
    assert [bpe.token_to_id(p) for p in pieces] == bpe.encode("영화 볼래?")
    assert bpe.id_to_token(bpe.mask_id) == "[MASK]"
    with pytest.raises(ValueError, match="must be 2-D"):
        bpe.decode_batch(torch.tensor([1, 2]))
    with pytest.raises(ValueError, match=r"ids must be in \[0, "):
        bpe.id_to_token(bpe.vocab_size)


def test_vocab_size_is_respected_and_bigger_vocab_compresses_more():
    small = T.train_tokenizer(CORPUS, kind="bpe", vocab_size=120)
    big = T.train_tokenizer(CORPUS, kind="bpe", vocab_size=400)
    assert small.vocab_size <= 120 and len(small) == small.vocab_size
    assert small.vocab_size < big.vocab_size <= 400
    n_small = sum(len(small.encode(t)) for t in KOREAN + ENGLISH)
    n_big = sum(len(big.encode(t)) for t in KOREAN + ENGLISH)
    assert n_big < n_small


def test_min_frequency_limits_merges():
    loose = T.train_tokenizer(CORPUS, kind="bpe", vocab_size=1000, min_frequency=1)
    strict = T.train_tokenizer(CORPUS, kind="bpe", vocab_size=1000, min_frequency=40)
    assert strict.vocab_size < loose.vocab_size


@pytest.mark.parametrize("kind", ["bpe", "wordpiece"])
def test_save_load_gives_identical_encodings(tmp_path, kind):
    tok = T.train_tokenizer(CORPUS, kind=kind, vocab_size=250, lowercase=True)
    path = tok.save(tmp_path / "sub" / "tok.json")
    assert [p.name for p in path.parent.iterdir()] == ["tok.json"]  # no temp file left behind
    payload = json.loads(path.read_text(encoding="utf-8"))
    assert payload["kind"] == kind and payload["lowercase"] is True
    back = T.SubwordTokenizer.load(path)
    assert (back.kind, back.lowercase, back.vocab_size) == (kind, True, tok.vocab_size)
    texts = ROUND_TRIP + ["  MIXED   Case 영화 ", "ㅋㅋ 영화"]
    assert back.encode_batch(texts, add_bos_eos=True) == tok.encode_batch(texts, add_bos_eos=True)
    assert [back.tokens(t) for t in texts] == [tok.tokens(t) for t in texts]


def test_load_rejects_other_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="no tokenizer file"):
        T.SubwordTokenizer.load(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not a valid tokenizer file"):
        T.SubwordTokenizer.load(bad)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"hello": 1}))
    with pytest.raises(ValueError, match="not written by SubwordTokenizer.save"):
        T.SubwordTokenizer.load(other)


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(texts=[]), ValueError, "texts is empty"),
    (dict(texts=["", "   "]), ValueError, "empty or blank"),
    (dict(texts="just one string"), TypeError, "single string"),
    (dict(texts=["ok", 3]), TypeError, r"texts\[1\]"),
    (dict(texts=["ok"], kind="unigram"), ValueError, "kind must be one of"),
    (dict(texts=["ok"], vocab_size=7), ValueError, "vocab_size must be larger"),
    (dict(texts=["ok"], vocab_size=100.0), TypeError, "vocab_size must be an int"),
    (dict(texts=["ok"], min_frequency=0), ValueError, "min_frequency"),
])
def test_train_tokenizer_validates(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        T.train_tokenizer(**kwargs)


def test_encode_decode_validate(bpe):
    with pytest.raises(TypeError, match="text must be a str"):
        bpe.encode(["영화"])
    with pytest.raises(ValueError, match=r"ids must be in \[0, "):
        bpe.decode([5, bpe.vocab_size])
    with pytest.raises(ValueError, match=r"ids must be in \[0, "):
        bpe.decode([-1])
    with pytest.raises(TypeError, match="integer ids"):
        bpe.decode(torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match="must be 1-D"):
        bpe.decode(torch.tensor([[8, 9]]))
    with pytest.raises(TypeError, match=r"ids\[1\] must be an int, got str"):
        bpe.decode([8, "9"])


# ----------------------------------------------------------------------------- simple_tokenize

def test_simple_tokenize_korean_and_english():
    assert T.simple_tokenize("영화 볼래?") == ["영화", "볼래", "?"]
    assert T.simple_tokenize("Hello, World!! It's 3.5") == ["hello", ",", "world", "!", "!", "it", "'", "s",
                                                             "3", ".", "5"]
    assert T.simple_tokenize("Hello, World", lowercase=False) == ["Hello", ",", "World"]
    # NFC: decomposed Hangul is composed first
    assert T.simple_tokenize(unicodedata.normalize("NFD", "영화 볼래?")) == ["영화", "볼래", "?"]
    assert T.simple_tokenize("   ") == []
    with pytest.raises(TypeError, match="text must be a str"):
        T.simple_tokenize(None)


def test_simple_tokenize_keeps_every_non_space_character():
    s = "제 이름은 \"민수\"예요... (진짜!) e-mail: a_b@c.kr"
    toks = T.simple_tokenize(s, lowercase=False)
    assert "".join(toks) == "".join(s.split())
    assert "민수" in toks and "예요" in toks and "a_b" in toks


# ----------------------------------------------------------------------------- WordVocab

def test_word_vocab_order_ties_and_caps():
    lists = [["b", "a", "c"], ["a", "c", "d"], ["a", "e"], ["c"]]  # a:3 c:3 b:1 d:1 e:1
    v = T.WordVocab.build(lists)
    assert v.itos[7:] == ["a", "c", "b", "d", "e"]  # by count, ties alphabetical
    assert T.WordVocab.build(list(reversed(lists))).itos == v.itos  # independent of data order
    capped = T.WordVocab.build(lists, max_size=9)
    assert len(capped) == 9 and capped.itos[7:] == ["a", "c"]
    frequent = T.WordVocab.build(lists, min_freq=2)
    assert frequent.itos[7:] == ["a", "c"]
    assert v.stoi == {t: i for i, t in enumerate(v.itos)}
    assert "a" in v and "zzz" not in v


def test_word_vocab_encode_decode():
    v = T.WordVocab.build([T.simple_tokenize(s) for s in KOREAN])
    toks = T.simple_tokenize("오늘 영화 볼래?")
    ids = v.encode(toks)
    assert v.decode(ids) == toks
    assert v.encode(["영화", "없는말"]) == [v.stoi["영화"], v.unk_id]
    wrapped = v.encode(toks, add_bos_eos=True)
    assert wrapped[0] == v.bos_id and wrapped[-1] == v.eos_id
    assert v.decode(wrapped + [v.pad_id]) == toks
    assert v.decode(wrapped, skip_special=False)[0] == "[BOS]"
    assert v.decode([v.unk_id, v.stoi["영화"]], join=True) == "[UNK] 영화"
    assert v.decode(torch.tensor(ids)) == toks


def test_word_vocab_save_load(tmp_path):
    v = T.WordVocab.build([T.simple_tokenize(s) for s in KOREAN + ENGLISH], max_size=40)
    back = T.WordVocab.load(v.save(tmp_path / "vocab.json"))
    assert back.itos == v.itos and back.stoi == v.stoi
    other = tmp_path / "x.json"
    other.write_text("[1, 2]")
    with pytest.raises(ValueError, match="not written by WordVocab.save"):
        T.WordVocab.load(other)


def test_word_vocab_validates():
    with pytest.raises(TypeError, match=r"token_lists\[0\] is a str"):
        T.WordVocab.build(["a sentence"])
    with pytest.raises(ValueError, match="max_size must be at least 7"):
        T.WordVocab.build([["a"]], max_size=3)
    with pytest.raises(ValueError, match="min_freq"):
        T.WordVocab.build([["a"]], min_freq=0)
    v = T.WordVocab.build([["a"]])
    with pytest.raises(TypeError, match="got a str"):
        v.encode("a b")
    with pytest.raises(ValueError, match=r"ids must be in \[0, 8\)"):
        v.decode([8])
    with pytest.raises(ValueError, match="must start with the special tokens"):
        T.WordVocab(["a", "b"])


# ----------------------------------------------------------------------------- padding

def test_pad_batch():
    seqs = [[5, 6, 7], [8], [9, 10]]
    x, lengths = T.pad_batch(seqs, pad_id=0)
    assert x.dtype == torch.long and x.shape == (3, 3)
    assert lengths.tolist() == [3, 1, 2]
    for row, s, n in zip(x, seqs, lengths):
        assert row[:n].tolist() == s and (row[n:] == 0).all()
    x, lengths = T.pad_batch(seqs, pad_id=1, max_len=2)
    assert x.tolist() == [[5, 6], [8, 1], [9, 10]] and lengths.tolist() == [2, 1, 2]
    # tensors in, same result
    x2, _ = T.pad_batch([torch.tensor(s) for s in seqs], pad_id=1, max_len=2)
    assert torch.equal(x, x2)


def test_pad_batch_validates():
    with pytest.raises(ValueError, match="seqs is empty"):
        T.pad_batch([], 0)
    with pytest.raises(ValueError, match="max_len must be >= 1"):
        T.pad_batch([[1]], 0, max_len=0)
    with pytest.raises(TypeError, match="integer ids"):
        T.pad_batch([torch.tensor([1.5])], 0)
    with pytest.raises(ValueError, match=r"seqs\[1\] must be 1-D"):
        T.pad_batch([[1], torch.ones(2, 2, dtype=torch.long)], 0)
    with pytest.raises(TypeError, match="seqs must be a list"):
        T.pad_batch("abc", 0)


def _keras_pad(seq, n, pad, truncating, padding):
    """The Keras rule, written independently: cut to n from the chosen side, fill the other side."""
    if len(seq) > n:
        seq = seq[len(seq) - n:] if truncating == "pre" else seq[:n]
    fill = [pad] * (n - len(seq))
    return fill + seq if padding == "pre" else seq + fill


@pytest.mark.parametrize("truncating", ["pre", "post"])
@pytest.mark.parametrize("padding", ["pre", "post"])
def test_pad_sequences_keras_semantics(truncating, padding):
    seqs = [[1, 2, 3, 4, 5], [6, 7], [], [8, 9, 10]]
    out = T.pad_sequences(seqs, max_len=3, pad_id=0, truncating=truncating, padding=padding)
    assert out.dtype == torch.long and out.shape == (4, 3)
    assert out.tolist() == [_keras_pad(s, 3, 0, truncating, padding) for s in seqs]


def test_pad_sequences_examples_and_defaults():
    # default: keep the end of long sequences, pad after
    assert T.pad_sequences([[1, 2, 3], [4]], max_len=2).tolist() == [[2, 3], [4, 0]]
    assert T.pad_sequences([[1, 2, 3], [4]], max_len=2, truncating="post", padding="pre",
                           pad_id=9).tolist() == [[1, 2], [9, 4]]
    assert T.pad_sequences([[1, 2, 3], [4]]).shape == (2, 3)
    with pytest.raises(ValueError, match="truncating must be 'pre' or 'post'"):
        T.pad_sequences([[1]], 2, truncating="end")
    with pytest.raises(ValueError, match="padding must be 'pre' or 'post'"):
        T.pad_sequences([[1]], 2, padding="left")


def test_collate_pairs_teacher_forcing_layout():
    collate = T.collate_pairs(pad_id=0)
    pairs = [([11, 12, 13], [21, 22]), ([14], [23, 24, 25, 26])]
    src, src_len, tgt_in, tgt_out = collate(pairs)
    assert src.tolist() == [[11, 12, 13], [14, 0, 0]] and src_len.tolist() == [3, 1]
    assert tgt_in.shape == tgt_out.shape == (2, 5)
    for i, (_, tgt) in enumerate(pairs):
        n = len(tgt) + 1
        assert tgt_in[i, :n].tolist() == [T.SPECIAL_IDS["bos"], *tgt]
        assert tgt_out[i, :n].tolist() == [*tgt, T.SPECIAL_IDS["eos"]]
        assert (tgt_in[i, n:] == 0).all() and (tgt_out[i, n:] == 0).all()
        # the decoder input at t+1 is the target at t
        assert tgt_in[i, 1:n].tolist() == tgt_out[i, :n - 1].tolist()


def test_collate_pairs_with_dataloader_and_limits():
    v = T.WordVocab.build([T.simple_tokenize(s) for s in KOREAN + ENGLISH])
    data = [(v.encode(T.simple_tokenize(k)), v.encode(T.simple_tokenize(e))) for k, e in zip(KOREAN, ENGLISH)]
    loader = torch.utils.data.DataLoader(data, batch_size=4,
                                         collate_fn=T.collate_pairs(v.pad_id, max_src_len=3, max_tgt_len=4))
    batches = list(loader)
    assert len(batches) == 3
    for src, src_len, tgt_in, tgt_out in batches:
        assert src.shape[1] <= 3 and tgt_in.shape[1] <= 4 and int(src_len.max()) == src.shape[1]
        assert (tgt_in[:, 0] == v.bos_id).all()
        # every row of tgt_out holds exactly one eos
        assert ((tgt_out == v.eos_id).sum(dim=1) == 1).all()


def test_collate_pairs_validates():
    with pytest.raises(ValueError, match="max_tgt_len must be >= 2"):
        T.collate_pairs(0, max_tgt_len=1)
    collate = T.collate_pairs(0)
    with pytest.raises(ValueError, match=r"batch\[1\] must be a \(src_ids, tgt_ids\) pair"):
        collate([([1], [2]), ([1], [2], [3])])
    with pytest.raises(ValueError, match="non-empty list"):
        collate([])
    with pytest.raises(TypeError, match=r"batch\[0\]\[1\] \(tgt\)"):
        collate([([1], "ab")])


_TRAIN_IN_A_FRESH_PROCESS = """
import hashlib, json, random, sys
from lib import text
rng = random.Random(0)
syllables = ["가", "나", "다", "라", "마", "영", "화", "재", "미", "없", "ab", "cd", "ing", "the", "re"]
texts = [" ".join("".join(rng.choice(syllables) for _ in range(rng.randint(1, 4)))
                  for _ in range(rng.randint(3, 12))) for _ in range(3000)]
tok = text.train_tokenizer(texts, kind=sys.argv[1], vocab_size=300)
print(hashlib.sha1(json.dumps(sorted(tok.hf.get_vocab().items())).encode()).hexdigest())
"""


def test_bpe_gives_the_same_vocabulary_and_ids_in_every_process():
    # Chapters that must repeat their numbers train BPE (see train_tokenizer's docstring: the
    # WordPiece trainer does not repeat). Two fresh processes, because the trainer's hash maps
    # are seeded per process.
    import subprocess
    import sys
    runs = {subprocess.run([sys.executable, "-c", _TRAIN_IN_A_FRESH_PROCESS, "bpe"], capture_output=True,
                           text=True, check=True).stdout.strip() for _ in range(2)}
    assert len(runs) == 1, "BPE training gave different vocabularies in two processes"


def test_unigram_nats_is_the_add_one_cross_entropy():
    # id 2 counted three times, id 3 once, in a vocabulary of 5: add one to every count
    train, test = [2, 2, 2, 3], [2, 3, 4]
    counts = torch.tensor([1.0, 1, 4, 2, 1])
    expected = -(counts / counts.sum()).log()[torch.tensor(test)].mean().item()
    assert T.unigram_nats(train, test, 5) == pytest.approx(expected)
    # a never-predicted id gets no mass and is not scored: the other ids share its count
    kept = torch.tensor([1.0, 0, 4, 2, 1])
    expected_never = -(kept / kept.sum()).log()[torch.tensor([2, 3, 4])].mean().item()
    assert T.unigram_nats(train + [1], test + [1], 5, never=[1]) == pytest.approx(expected_never)
    # uniform when nothing was counted: log V
    assert T.unigram_nats([], [0, 1], 7) == pytest.approx(np.log(7))


@pytest.mark.parametrize("args, match", [
    (([0, 9], [0], 5), r"train_ids holds ids outside \[0, 5\): \[9\]"),
    (([0], [-1], 5), r"test_ids holds ids outside"),
    (([0], [1], 2, [0, 1]), "never leaves no id"),
    (([0], [1], 3, [1]), "nothing to score"),
    (([0], [1], 0), "vocab_size"),
])
def test_unigram_nats_rejects_bad_ids(args, match):
    with pytest.raises(ValueError, match=match):
        T.unigram_nats(*args)
