"""tools.pretrain: no test review in the pretraining text, exact resume after an interruption,
two processes equal to one at the same global batch, and what the output folder holds."""
import dataclasses
import json
from pathlib import Path

import pytest
import torch

from lib import checkpoints, train
from lib.train import distributed
from lib.text import SubwordTokenizer
from lib.train.checkpoint import read_checkpoint
from tools import pretrain


def run(tmp: Path, *args: str) -> dict | None:
    return pretrain.main(["ko-bert-tiny", "--out", str(tmp / "out"), "--scratch", str(tmp / "scratch"), *args])


def state(tmp: Path) -> dict:
    return read_checkpoint(tmp / "scratch" / "ko-bert-tiny" / "state.pt")


# ----------------------------------------------------------------------------- the data

def test_ko_bert_text_has_no_test_review(data_mirror):
    from lib.data import load_nsmc_raw
    from lib.data.nsmc import is_test, sentiment_split
    from lib.data.nsmc_corpus import pretraining_reviews

    rows = load_nsmc_raw()
    texts, counts = pretraining_reviews(rows)
    norm = lambda s: " ".join(s.split())                                     # noqa: E731
    test_texts = {norm(r["review"]) for r in rows if is_test(r["review_id"])}
    assert not test_texts & set(texts)
    split = sentiment_split(rows, train_per_class=1000, test_per_class=1000)    # what the chapters test on
    assert not {norm(r["text"]) for r in split.test} & set(texts)
    assert {norm(r["text"]) for r in split.train[:200]} & set(texts)            # but it reads training reviews
    assert counts["reviews"] == len(texts) > 500_000 and counts["same_text_as_a_test_review"] > 0


def test_gpt_imdb_text_has_no_test_review(data_mirror):
    from lib.data import load_imdb
    texts, counts = pretrain.CORPORA[pretrain.RECIPES["gpt-imdb"].corpus][0]()
    assert not {r["text"] for r in load_imdb("test")} & set(texts)
    assert counts["reviews"] == len(texts) > 70_000


def test_global_batches_do_not_depend_on_the_number_of_processes():
    one = train.GlobalBatchSampler(40, 8, seed=3, world=1, rank=0)
    two = [train.GlobalBatchSampler(40, 8, seed=3, world=2, rank=r) for r in range(2)]
    for epoch in (0, 1):
        for s in (one, *two):
            s.set_epoch(epoch)
        together = [a + b for a, b in zip(*two)]
        assert together == list(one) and len(together) == 5
        assert sorted(i for b in one for i in b) == list(range(40))
    assert list(one) != (one.set_epoch(0) or list(one))              # a new order every epoch
    tagged = train.GlobalBatchSampler(40, 8, seed=3, tag_epoch=True, world=1, rank=0)
    tagged.set_epoch(2)
    assert sorted(i for b in tagged for i in b) == list(range(80, 120))


# ----------------------------------------------------------------------------- resume and processes

def test_interrupted_and_resumed_run_equals_an_uninterrupted_one(data_mirror, tmp_path, monkeypatch):
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    run(whole)                                          # 12 steps, dropout 0.1: the random states matter
    assert run(parts, "--minutes", "0") == {"card": None}           # stops after the first chunk (step 4)
    assert state(parts)["step"] == 4
    calls = []

    def dies_at_step_7(model, batch):
        calls.append(1)
        if len(calls) == 3:                             # steps 5, 6, then killed inside step 7
            raise KeyboardInterrupt
        return pretrain.mlm_step(model, batch)

    monkeypatch.setitem(pretrain.STEP_FNS, "bert-mlm", dies_at_step_7)
    with pytest.raises(KeyboardInterrupt):
        run(parts)
    monkeypatch.undo()
    assert state(parts)["step"] == 4                   # the last checkpoint
    run(parts)
    a, b = state(whole), state(parts)
    assert a["step"] == b["step"] == 12
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    assert a["history"] == b["history"] and len(a["history"]["records"]) == 12
    weights = [(d / "out" / "ko-bert-tiny" / "model.safetensors").read_bytes() for d in (whole, parts)]
    assert weights[0] == weights[1]
    clock = json.loads((parts / "scratch" / "ko-bert-tiny" / "clock.json").read_text())
    # the invocations whose chunks made the model (the killed one finished no chunk, so it left no record)
    assert [(i["from_step"], i["to_step"]) for i in clock["invocations"]] == [(0, 4), (4, 12)]


def test_two_processes_give_the_loss_curve_of_one_at_the_same_global_batch(data_mirror, tmp_path):
    no_dropout = ["--set", "model.dropout=0", "--set", "model.attention_dropout=0"]
    proc = distributed.torchrun("tools.pretrain", "ko-bert-tiny", "--out", tmp_path / "two" / "out", "--scratch",
                                tmp_path / "two" / "scratch", *no_dropout, processes=2, timeout=240)
    assert "process 0 of 2" in proc.stdout
    run(tmp_path / "one", *no_dropout)
    two, one = state(tmp_path / "two"), state(tmp_path / "one")
    assert two["loop"]["world_size"] == 2 and one["loop"]["world_size"] == 1
    curve = {name: train.History.from_dict(s["history"]) for name, s in (("one", one), ("two", two))}
    assert curve["two"].values("train_loss") == pytest.approx(curve["one"].values("train_loss"), rel=1e-5)
    assert curve["two"].values("eval_loss") == pytest.approx(curve["one"].values("eval_loss"), rel=1e-5)
    assert curve["one"].values("train_loss")[-1] < curve["one"].values("train_loss")[0]
    for k, v in one["model"].items():
        assert torch.allclose(two["model"][k], v, atol=1e-5), k


# ----------------------------------------------------------------------------- the output

def test_output_has_weights_tokenizer_card_and_registry_and_no_optimizer_state(data_mirror, tmp_path):
    result = run(tmp_path, "--snapshots", "1024")
    card, out = result["card"], tmp_path / "out"
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert files == ["ko-bert-tiny/card.json", "ko-bert-tiny/card.md", "ko-bert-tiny/model.safetensors",
                     "ko-bert-tiny/snapshots/ko-bert-tiny-1024.safetensors", "ko-bert-tiny/tokenizer.json",
                     "registry.json"]
    recipe = pretrain.RECIPES["ko-bert-tiny"]
    assert card["training"]["tokens_seen"] == card["training"]["steps"] * recipe.tokens_per_step == 3072
    assert [c["tokens"] for c in card["heldout"]["curve"]] == [1024, 2048, 3072]
    assert card["data"]["datasets"][0]["sha256"].startswith("3675f6fb")
    assert card["training"]["precision"] == "fp32" and "device=cpu" in card["training"]["device"]
    assert len(card["commit"]) >= 7 and card["command"].startswith("python -m tools.pretrain ko-bert-tiny")
    # the registered checkpoint is the trained model, in its stored dtype
    ckpt = checkpoints.load("ko-bert-tiny", root=out)
    stored = card["heldout"]["stored_dtype"]
    loss = pretrain.heldout_loss(ckpt.model, result["heldout"], "bert-mlm")
    assert loss == pytest.approx(card["heldout"]["by_stored_dtype"][stored], abs=1e-6)
    assert abs(loss - card["heldout"]["loss"]) <= pretrain.DTYPE_TOLERANCE
    assert ckpt.tokenizer.encode("영화 정말 재밌다") == result["tokenizer"].encode("영화 정말 재밌다")
    snap = checkpoints.load("ko-bert-tiny@1024", root=out)
    assert snap.card["tokens_seen"] == 1024
    assert checkpoints.along_the_run("ko-bert-tiny", out) == {1024: "ko-bert-tiny@1024", 3072: "ko-bert-tiny"}
    assert checkpoints.snapshots("ko-bert-tiny", out) == ["ko-bert-tiny@1024"]
    assert "# ko-bert-tiny" in (out / "ko-bert-tiny" / "card.md").read_text()
    # the same command once the schedule has ended writes the same checkpoint again
    before = checkpoints.info("ko-bert-tiny", out).files["weights"].sha256
    again = run(tmp_path, "--snapshots", "1024")["card"]
    assert checkpoints.info("ko-bert-tiny", out).files["weights"].sha256 == before
    assert again["heldout"]["curve"] == card["heldout"]["curve"]


def assert_the_card_reports_the_stored_weights(ckpt, result, kind, falls=True):
    # the held-out loss of the loaded (stored, rounded) weights is the card's, and it fell while training
    card = result["card"]
    loss = pretrain.heldout_loss(ckpt.model, result["heldout"], kind)
    assert loss == pytest.approx(card["heldout"]["by_stored_dtype"][card["heldout"]["stored_dtype"]], abs=1e-6)
    curve = card["heldout"]["curve"]
    assert not falls or curve[-1]["heldout_loss"] < curve[0]["heldout_loss"]


def test_the_gpt_recipe_trains_and_loads_as_a_gpt(data_mirror, tmp_path):
    from lib.models.gpt import GPT
    result = pretrain.main(["gpt-imdb-tiny", "--out", str(tmp_path / "out"), "--scratch", str(tmp_path / "s")])
    ckpt = checkpoints.load("gpt-imdb-tiny", root=tmp_path / "out")
    assert isinstance(ckpt.model, GPT) and ckpt.model.lm_head.weight is ckpt.model.wte.weight
    x, y = result["heldout"][0]
    assert torch.equal(y[:, :-1], x[:, 1:])                        # next-token targets
    assert_the_card_reports_the_stored_weights(ckpt, result, "gpt-lm")


def test_the_character_recipe_reads_tiny_shakespeare_as_characters_and_loads_as_a_switch_gpt(data_mirror, tmp_path):
    from lib import data
    from lib.models.switch import SwitchGPT
    from tools.pretrain import characters
    result = pretrain.main(["switch-shakespeare-tiny", "--out", str(tmp_path / "out"), "--scratch", str(tmp_path / "s")])
    ckpt = checkpoints.load("switch-shakespeare-tiny", root=tmp_path / "out")
    assert isinstance(ckpt.model, SwitchGPT) and ckpt.model.cfg.num_experts == 4
    text, vocab = data.load_tinyshakespeare(), ckpt.tokenizer
    cut = int(0.9 * len(text))
    assert set(vocab.itos[7:]) == set(text[:cut]) and vocab.unk_id not in vocab.encode(list(text[:cut]))
    # the held-out windows are the chapters' validation windows (random_windows, seed 2, last 10 %)
    ids = torch.tensor(vocab.encode(list(text)))
    expected = data.random_windows(ids[cut:], 17, 8, seed=2)
    x, y = torch.cat([b[0] for b in result["heldout"]]), torch.cat([b[1] for b in result["heldout"]])
    assert torch.equal(x, expected[:, :-1]) and torch.equal(y, expected[:, 1:])
    # a training example is 16 consecutive characters of the training part and the next 16
    dataset = characters.Windows(ids[:cut], 16)
    xi, yi = dataset[1234]
    assert "".join(vocab.itos[i] for i in xi) == text[1234:1250]
    assert torch.equal(yi[:-1], xi[1:]) and len(dataset) == cut - 16
    card = json.loads((tmp_path / "out" / "switch-shakespeare-tiny" / "card.json").read_text())
    assert "the last 10% of the characters held out" in (tmp_path / "out" / "switch-shakespeare-tiny" / "card.md").read_text()
    assert card["data"]["counts"]["characters"] == len(text)
    assert_the_card_reports_the_stored_weights(ckpt, result, "switch-gpt")


def test_the_adaptive_span_recipe_gives_the_spans_their_own_rate_and_pays_for_them(data_mirror, tmp_path):
    from lib.models.memory import CharLM
    result = pretrain.main(["adaptive-span-tiny", "--out", str(tmp_path / "out"), "--scratch", str(tmp_path / "s")])
    ckpt = checkpoints.load("adaptive-span-tiny", root=tmp_path / "out")
    assert isinstance(ckpt.model, CharLM) and ckpt.model.cfg.attention == "adaptive"
    groups = read_checkpoint(tmp_path / "s" / "adaptive-span-tiny" / "state.pt")["optimizer"]["param_groups"]
    recipe = pretrain.RECIPES["adaptive-span-tiny"]
    assert len(groups) == 2 and groups[1]["weight_decay"] == 0.0 and groups[0]["weight_decay"] == recipe.weight_decay
    assert groups[1]["initial_lr"] == recipe.span_lr and groups[0]["initial_lr"] == recipe.lr
    assert len(groups[1]["params"]) == ckpt.model.cfg.num_layers          # one span ratio per layer
    spans = [r["mean_span"] for r in result["history"].records if "mean_span" in r]
    assert spans and spans[-1] < spans[0]                     # the penalty shrinks the spans
    assert_the_card_reports_the_stored_weights(ckpt, result, "char-lm", falls=False)


def test_the_transformer_xl_recipe_reads_the_text_in_order_and_resumes_with_its_memory(data_mirror, tmp_path,
                                                                                       monkeypatch):
    from lib import data
    from lib.models.transformer_xl import TransformerXL, batchify, evaluate_with_memory
    from tools.pretrain import characters
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    result = pretrain.main(["txl-tiny", "--out", str(whole / "out"), "--scratch", str(whole / "s")])
    ckpt = checkpoints.load("txl-tiny", root=whole / "out")
    assert isinstance(ckpt.model, TransformerXL) and ckpt.model.cfg.mem_len == 8
    recipe, vocab, text = pretrain.RECIPES["txl-tiny"], ckpt.tokenizer, data.load_tinyshakespeare()
    cut = int(0.9 * len(text))
    ids = torch.tensor(vocab.encode(list(text)))
    # the chapter's layout: 4 streams side by side; segment k + 1 of a row continues segment k
    segs = characters.segments(ids[:cut], recipe.batch_size, recipe.seq_len)
    rows = cut // recipe.batch_size
    assert bool(segs[0][2]) and not any(bool(f) for _, _, f in segs[1:])
    assert "".join(vocab.itos[i] for i in segs[1][0][1]) == text[rows + 8:rows + 16]
    assert torch.equal(segs[0][1][:, :-1], segs[0][0][:, 1:]) and torch.equal(segs[1][0][:, 0], segs[0][1][:, -1])
    # the held-out loss: the first 16 x 8 held-out characters as 8 streams, read with the memory of 8
    stream = batchify(ids[cut:cut + 16 * 8], 8)
    assert pretrain.heldout_loss(ckpt.model, result["heldout"], "txl-lm") == pytest.approx(
        evaluate_with_memory(ckpt.model, stream, 8, 8)["loss"], abs=1e-6)
    assert_the_card_reports_the_stored_weights(ckpt, result, "txl-lm", falls=False)
    # stopped after its first chunk and resumed: the memory goes on as if never stopped
    assert pretrain.main(["txl-tiny", "--out", str(parts / "out"), "--scratch", str(parts / "s"), "--minutes", "0"]) \
        == {"card": None}
    assert read_checkpoint(parts / "s" / "txl-tiny" / "state.pt")["extra"]["step_state"]["mems"] is not None
    pretrain.main(["txl-tiny", "--out", str(parts / "out"), "--scratch", str(parts / "s")])
    a, b = (read_checkpoint(d / "s" / "txl-tiny" / "state.pt") for d in (whole, parts))
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    # (every chunk resumes from the saved state, so a memory lost there would train otherwise)
    monkeypatch.setattr(characters.MemoryStep, "load_state_dict", lambda self, state: setattr(self, "mems", None))
    pretrain.main(["txl-tiny", "--out", str(tmp_path / "lost" / "out"), "--scratch", str(tmp_path / "lost" / "s")])
    c = read_checkpoint(tmp_path / "lost" / "s" / "txl-tiny" / "state.pt")
    assert not all(torch.equal(a["model"][k], c["model"][k]) for k in a["model"])


def test_the_xlnet_recipe_gives_every_window_its_own_order(data_mirror, tmp_path):
    from lib.models.xlnet import XLNet
    from tools.pretrain import characters
    result = pretrain.main(["xlnet-tiny", "--out", str(tmp_path / "out"), "--scratch", str(tmp_path / "s")])
    ckpt = checkpoints.load("xlnet-tiny", root=tmp_path / "out")
    assert isinstance(ckpt.model, XLNet)
    stream = torch.load(tmp_path / "s" / "xlnet-tiny" / "data" / "streams.pt", weights_only=True)["train"]
    windows = characters.PermutedWindows(stream, 12, seed=0)
    (x0, o0), (x1, o1) = windows[5], windows[6]
    assert torch.equal(x0, stream[5:17].long()) and torch.equal(x1[:-1], x0[1:])
    assert sorted(o0.tolist()) == list(range(12)) and not torch.equal(o0, o1)
    assert torch.equal(windows[5][1], o0) and not torch.equal(windows[5 + len(windows)][1], o0)   # new each epoch
    # held out: fixed windows and orders, the loss on the last 12 // 6 = 2 positions of each order
    x, order, predict = result["heldout"][0]
    assert int(predict) == 2 and x.shape == order.shape == (4, 12)
    assert pretrain.heldout_loss(ckpt.model, result["heldout"][:1], "xlnet-plm") == pytest.approx(
        ckpt.model.eval().permutation_lm_loss(x, order, 2).item(), abs=1e-5)
    assert_the_card_reports_the_stored_weights(ckpt, result, "xlnet-plm", falls=False)


def test_the_review_recipe_trains_a_classifier_on_its_training_reviews_and_keeps_its_best(data_mirror, tmp_path):
    from lib.data import reviews
    from lib.models.bilstm_attention import BiLSTMAttentionClassifier
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    result = pretrain.main(["bilstm-tiny", "--out", str(whole / "out"), "--scratch", str(whole / "s")])
    ckpt = checkpoints.load("bilstm-tiny", root=whole / "out")
    assert isinstance(ckpt.model, BiLSTMAttentionClassifier) and ckpt.model.attention is not None
    recipe = pretrain.RECIPES["bilstm-tiny"]
    rows = reviews.rows("imdb-sentiment", "train")
    keep, held = reviews.validation_split(len(rows), recipe.validation)
    assert len(held) == 50 and not set(keep) & set(held) and len(keep) + len(held) == len(rows)
    # the vocabulary is the training part's; the validation reviews are scored as their last 20 words
    assert ckpt.tokenizer.itos == reviews.train_tokenizer("imdb-sentiment", [rows[i]["text"] for i in keep], 50).itos
    ids, _ = reviews.encode(ckpt.tokenizer, [rows[i]["text"] for i in held], 20)
    validation = list(zip(ids, [rows[i]["label"] for i in held]))
    correct, losses = reviews.predictions(ckpt.model, validation)
    assert pretrain.heldout_loss(ckpt.model, result["heldout"], "bilstm-classify") == pytest.approx(losses.mean(),
                                                                                                  abs=1e-6)
    card = result["card"]
    curve = card["heldout"]["curve"]
    assert card["training"]["kept"]["step"] == min(curve, key=lambda c: c["heldout_loss"])["step"]
    assert "nats/review" in (whole / "out" / "bilstm-tiny" / "card.md").read_text()
    assert_the_card_reports_the_stored_weights(ckpt, result, "bilstm-classify", falls=False)
    # stopped after its first chunk and resumed: the same weights
    assert pretrain.main(["bilstm-tiny", "--out", str(parts / "out"), "--scratch", str(parts / "s"),
                          "--minutes", "0"]) == {"card": None}
    pretrain.main(["bilstm-tiny", "--out", str(parts / "out"), "--scratch", str(parts / "s")])
    a, b = (read_checkpoint(d / "s" / "bilstm-tiny" / "state.pt") for d in (whole, parts))
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])


def test_the_chapter_2_recipes_read_three_passes_of_their_training_reviews(data_mirror):
    from lib.data import reviews, nsmc
    from tools.pretrain.reviews import TRAINED_ON
    sizes = {"imdb-sentiment": 25_000, "nsmc-sentiment": len(nsmc.sentiment_split().train)}
    for name, recipe in pretrain.RECIPES.items():
        if recipe.kind == "bilstm-classify" and not name.endswith("tiny"):
            kept, _ = reviews.validation_split(sizes[recipe.corpus], recipe.validation)
            assert TRAINED_ON[recipe.corpus] == len(kept) and recipe.tokens == 3 * len(kept), name
    base = pretrain.RECIPES["bilstm-tiny"]
    with pytest.raises(ValueError, match="with a validation split"):
        dataclasses.replace(base, validation=0.0, keep_best=False)
    with pytest.raises(ValueError, match="counting reviews"):
        dataclasses.replace(base, kind="gpt-lm")
    with pytest.raises(ValueError, match="is read as 'words'"):
        dataclasses.replace(base, tokenizer="bpe")


def test_a_character_recipe_must_read_a_character_corpus():
    recipe = pretrain.RECIPES["switch-shakespeare-tiny"]
    with pytest.raises(ValueError, match="read as characters"):
        dataclasses.replace(recipe, tokenizer="bpe")
    with pytest.raises(ValueError, match="character kind"):
        dataclasses.replace(recipe, kind="bert-mlm")
    with pytest.raises(ValueError, match="adaptive spans"):
        dataclasses.replace(recipe, span_loss=1e-3)


def test_the_bart_recipe_denoises_the_reviews_of_its_stretch_and_loads_as_a_bart(data_mirror, tmp_path):
    from lib.models.bart import Bart
    result = pretrain.main(["bart-ko-tiny", "--out", str(tmp_path / "out"), "--scratch", str(tmp_path / "s")])
    ckpt = checkpoints.load("bart-ko-tiny", root=tmp_path / "out")
    assert isinstance(ckpt.model, Bart) and ckpt.model.lm_head.weight is ckpt.model.embed.weight
    recipe, tok = pretrain.RECIPES["bart-ko-tiny"], ckpt.tokenizer
    stream = torch.load(tmp_path / "s" / "bart-ko-tiny" / "data" / "streams.pt", weights_only=True)["train"]
    data = pretrain.PackedDenoising(stream, recipe.seq_len, tok, 0, recipe.mask_prob)
    for index in range(20):
        src, tgt_in, tgt_out = data[index]
        stretch = [t for t in stream[index * recipe.seq_len:(index + 1) * recipe.seq_len].tolist() if t != tok.eos_id]
        target = tgt_out[tgt_out != -100].tolist()
        assert target == stretch + [tok.eos_id]                   # the original reviews, separators dropped
        assert tgt_in[:len(target)].tolist() == [tok.bos_id] + stretch
        source = [t for t in src.tolist() if t != tok.pad_id]
        assert source[-1] == tok.eos_id and tok.mask_id in source
        kept = [t for t in source[:-1] if t != tok.mask_id]
        assert sorted(kept) != sorted(stretch) and set(kept) <= set(stretch)   # infilling hid some tokens
        assert len(kept) == pytest.approx(0.7 * len(stretch), abs=1)           # 30 % of them
    assert torch.equal(data[3][0], data[3][0]) and not torch.equal(data[3][0], data[3 + len(data)][0])  # new each epoch
    assert_the_card_reports_the_stored_weights(ckpt, result, "bart-denoise")


def test_the_elmo_recipe_reads_words_as_bytes_and_predicts_the_vocabulary_s_words(data_mirror, tmp_path):
    from lib.models import elmo
    result = pretrain.main(["elmo-ko-tiny", "--out", str(tmp_path / "out"), "--scratch", str(tmp_path / "s")])
    ckpt = checkpoints.load("elmo-ko-tiny", root=tmp_path / "out")
    vocab, recipe = ckpt.tokenizer, pretrain.RECIPES["elmo-ko-tiny"]
    assert isinstance(ckpt.model, elmo.BiLM) and len(vocab) == recipe.vocab_size
    streams = torch.load(tmp_path / "s" / "elmo-ko-tiny" / "data" / "streams.pt", weights_only=True)
    data = pretrain.PackedWordLM(streams["train"], recipe.seq_len, vocab, streams)
    max_chars, unknown = recipe.model["max_chars"], 0
    for index in range(10):
        chars, length, target = data[index]
        assert chars.shape == (recipe.seq_len, max_chars) and int(length) == recipe.seq_len
        for word_bytes, t in zip(chars.tolist(), target.tolist()):
            body = word_bytes[1:word_bytes.index(elmo.EOW)]
            if body in ([259], [260]):                                  # <S>, </S>
                assert t == (vocab.bos_id if body == [259] else vocab.eos_id)
                continue
            word = bytes(b - 1 for b in body).decode("utf-8", errors="ignore")
            if len(body) < max_chars - 2:                               # a word not cut at max_chars
                assert word_bytes == elmo.encode_word(word, max_chars)
                expected = vocab.encode([word])[0]
                assert t == (-100 if expected == vocab.unk_id else expected), (word, t)
            unknown += t == -100
    assert unknown > 0                                                  # rare words are read, never predicted
    assert_the_card_reports_the_stored_weights(ckpt, result, "elmo-bilm", falls=False)
    card = result["card"]
    assert card["tokenizer"]["kind"] == "words"


def test_the_t5_recipe_corrupts_spans_with_the_last_ids_as_sentinels_and_loads_as_a_t5(data_mirror, tmp_path,
                                                                                          monkeypatch):
    from lib import device
    from lib.models.t5 import T5
    # on a CPU with native bfloat16, the policy trains this narrow model in float32, and the card says so
    monkeypatch.setenv(device.PRECISION_ENV, "auto")
    monkeypatch.setattr(device, "cpu_bf16_flag", lambda: "avx512_bf16")
    result = pretrain.main(["t5-mix-tiny", "--out", str(tmp_path / "out"), "--scratch", str(tmp_path / "s")])
    ckpt = checkpoints.load("t5-mix-tiny", root=tmp_path / "out")
    recipe, tok = pretrain.RECIPES["t5-mix-tiny"], ckpt.tokenizer
    assert isinstance(ckpt.model, T5) and ckpt.model.cfg.vocab_size == tok.vocab_size + pretrain.T5_SENTINELS
    assert (ckpt.model.cfg.pad_id, ckpt.model.cfg.eos_id) == (tok.pad_id, tok.eos_id)
    stream = torch.load(tmp_path / "s" / "t5-mix-tiny" / "data" / "streams.pt", weights_only=True)["train"]
    data = pretrain.PackedSpanCorruption(stream, recipe.seq_len, tok, 0, recipe.mask_prob)
    first_sentinel = ckpt.model.cfg.vocab_size - 1                        # <extra_id_0>: the very last id
    for index in range(20):
        src, tgt = data[index]
        stretch = stream[index * recipe.seq_len:(index + 1) * recipe.seq_len].tolist()
        assert src[-1] == tgt[-1] == tok.eos_id and src.shape == data[0][0].shape and tgt.shape == data[0][1].shape
        # putting each span back at its sentinel gives the stretch again
        spans, current = {}, None
        for t in tgt[:-1].tolist():
            if t >= tok.vocab_size:
                current = t
                spans[t] = []
            else:
                spans[current].append(t)
        rebuilt = [u for t in src[:-1].tolist() for u in (spans[t] if t >= tok.vocab_size else [t])]
        assert rebuilt == stretch
        assert tgt[0] == first_sentinel and sum(map(len, spans.values())) == round(0.15 * recipe.seq_len)
    assert not torch.equal(data[3][0], data[3 + len(data)][0])            # new noise each epoch
    assert_the_card_reports_the_stored_weights(ckpt, result, "t5-span")
    assert result["card"]["training"]["precision"] == "fp32"
    # T5's optimiser: Adafactor's factored second moments (a row and a column vector per matrix, a full
    # one per vector) are what the resume state holds, and the card names it
    card_md = (tmp_path / "out" / "t5-mix-tiny" / "card.md").read_text()
    assert result["card"]["training"]["optimizer"] == "adafactor" and "adafactor at lr 0.01" in card_md
    assert "| after another input |" in card_md     # the curve's column for the input-reading test
    moments = read_checkpoint(tmp_path / "s" / "t5-mix-tiny" / "state.pt")["optimizer"]["state"]
    kinds = [frozenset(m) - {"step"} for m in moments.values()]
    assert set(kinds) == {frozenset({"row_var", "col_var"}), frozenset({"variance"})}
    # every point of the curve also scores the targets after another example's input: the same model
    # and targets, so the two losses differ (whether the input helps is what a run watches for)
    curve = result["card"]["heldout"]["curve"]
    assert curve and all("heldout_loss_other_input" in c for c in curve)
    assert all(c["heldout_loss_other_input"] != c["heldout_loss"] for c in curve)


def test_the_t5_corpus_never_holds_a_test_item_of_chapter_11(data_mirror):
    from lib.data import load_chatbot, load_tatoeba
    from lib.translation import is_held_out
    docs, counts = pretrain.corpora._t5_mix()
    assert counts["documents"] == len(docs) and counts["french_sentences"] > 10_000
    docs = set(docs)
    pairs = load_tatoeba("fra_eng")
    assert not any(r["en"] in docs or r["other"] in docs for r in pairs if is_held_out(r["en"]))
    assert sum(r["other"] in docs for r in pairs[:2000]) > 1000                 # the French side is there
    assert not any(r["q"] in docs or r["a"] in docs for r in load_chatbot() if is_held_out(r["q"]))
    assert counts["chatbot_texts"] > 15_000


def test_a_snapshot_missed_by_an_interruption_is_written_on_resume(data_mirror, tmp_path, monkeypatch):
    def killed(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(pretrain.card, "write_snapshot", killed)      # killed after the checkpoint at 1024 tokens
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, "--snapshots", "1024", "--minutes", "0")
    monkeypatch.undo()
    at_snapshot = state(tmp_path)
    assert at_snapshot["step"] == 4 and "ko-bert-tiny@1024" not in checkpoints.registry(tmp_path / "out")
    run(tmp_path, "--snapshots", "1024", "--minutes", "0")
    snap = checkpoints.load("ko-bert-tiny@1024", root=tmp_path / "out")
    assert snap.card["steps"] == 4 and state(tmp_path)["step"] == 8
    stored = pretrain.DTYPES[snap.card["stored_dtype"]]
    key = "bert.embeddings.word_embeddings.weight"
    assert torch.equal(snap.model.state_dict()[key], checkpoints.as_stored(at_snapshot["model"][key], stored))


def test_storage_dtype_is_the_smallest_that_loses_nothing_measurable():
    tol = pretrain.DTYPE_TOLERANCE
    assert pretrain.storage_dtype({"float32": 5.0, "int8": 5.0 - tol / 2, "float16": 5.0, "bfloat16": 5.0}) == "int8"
    assert pretrain.storage_dtype({"float32": 5.0, "int8": 5.0 + 2 * tol, "float16": 5.0 + tol / 2,
                                   "bfloat16": 5.0}) == "float16"
    assert pretrain.storage_dtype({"float32": 5.0, "int8": 5.0, "float16": 5.0 + 2 * tol, "bfloat16": 5.0 - tol / 2}
                                  ) == "int8"
    assert pretrain.storage_dtype({"float32": 5.0, "int8": 5.0 + 3 * tol, "float16": 5.0 + 2 * tol,
                                   "bfloat16": 5.0 - tol / 2}) == "bfloat16"
    assert pretrain.storage_dtype({"float32": 5.0, "int8": 5.0 + 4 * tol, "float16": 5.0 + 2 * tol,
                                   "bfloat16": 5.0 + 3 * tol}) == "float32"


def test_a_resumed_run_must_keep_its_settings(data_mirror, tmp_path):
    run(tmp_path, "--minutes", "0")
    with pytest.raises(SystemExit, match="tokens"):
        run(tmp_path, "--tokens", "4096")
    data = (tmp_path / "scratch" / "ko-bert-tiny" / "data" / "streams.pt").stat().st_mtime_ns
    assert run(tmp_path, "--tokens", "4096", "--fresh", "--minutes", "0") == {"card": None}
    assert state(tmp_path)["step"] == 4 and json.loads(
        (tmp_path / "scratch" / "ko-bert-tiny" / "run.json").read_text())["tokens"] == 4096
    assert (tmp_path / "scratch" / "ko-bert-tiny" / "data" / "streams.pt").stat().st_mtime_ns == data
    with pytest.raises(SystemExit, match="separate"):
        pretrain.main(["ko-bert-tiny", "--out", str(tmp_path), "--scratch", str(tmp_path / "s")])


def test_knowledge_masking_recipe_hides_whole_units_of_the_same_stream(data_mirror, tmp_path):
    """ernie-ko's code at toy size: the same token stream as the token-masking recipe, phrase and
    entity units aligned with it, whole units hidden at their level, and the run trains and loads."""
    out, scratch = tmp_path / "out", tmp_path / "scratch"
    pretrain.main(["ernie-ko-tiny", "--out", str(out), "--scratch", str(scratch)])
    knowledge = pretrain.RECIPES["ernie-ko-tiny"]
    data = torch.load(scratch / "ernie-ko-tiny" / "data" / "streams.pt", weights_only=True)
    twin = dataclasses.replace(knowledge, name="twin", masking="token")
    pretrain.prepare(twin, tmp_path / "twin")
    token_data = torch.load(tmp_path / "twin" / "streams.pt", weights_only=True)
    assert torch.equal(data["train"], token_data["train"]) and "train_phrase" not in token_data
    tok = SubwordTokenizer.load(scratch / "ernie-ko-tiny" / "data" / "tokenizer.json")
    sep = tok.sep_id
    for level in ("phrase", "entity"):
        units = data[f"train_{level}"]
        assert units.shape == data["train"].shape
        assert (units[data["train"] == sep] == -1).all() and (units >= 0).any()
    ds = pretrain.make_dataset(knowledge, data, "train", tok, seed=0)
    whole = 0
    for index in range(60):
        inputs, labels = ds[index]
        level = ("basic", "phrase", "entity")[index % 3]
        row = ds.units[level][index % len(ds.chunks)] if level != "basic" else None
        hidden = (labels != -100).nonzero()[:, 0].tolist()
        assert hidden and int(inputs[0]) == tok.cls_id and 0 not in hidden
        if row is not None:         # every hidden unit is hidden whole (within the sequence)
            for t in hidden:
                u = int(row[t - 1])
                if u >= 0:
                    members = [p + 1 for p in (row == u).nonzero()[:, 0].tolist()]
                    assert set(members) <= set(hidden)
                    whole += len(members) > 1
    assert whole > 0
    assert checkpoints.load("ernie-ko-tiny", root=out).model.cfg.hidden_size == 32
    with pytest.raises(ValueError, match="masking must be"):
        dataclasses.replace(knowledge, masking="entity")


def test_the_card_names_the_code_each_invocation_started_from():
    one = {"commit": "aaa1111", "uncommitted_changes": False}
    assert pretrain.code_version([one]) == one
    assert pretrain.code_version([one, {**one, "uncommitted_changes": None}]) == one
    two = pretrain.code_version([one, {"commit": "bbb2222", "uncommitted_changes": True}])
    assert two == {"commit": "aaa1111", "uncommitted_changes": True, "commits": ["aaa1111", "bbb2222"]}


def test_card_counts_are_written_out_also_when_nested():
    # the t5-mix corpus nests the NSMC counts in its own: the card's Markdown must still read them
    from tools.pretrain import counts_text
    text = counts_text({"documents": 1234, "nsmc": {"rows": 712404, "test_side_reviews": 5}, "english_reviews": 10})
    assert text == "documents 1,234, nsmc (rows 712,404, test side reviews 5), english reviews 10"


def test_a_recipe_names_an_optimizer_the_runner_knows():
    recipe = dataclasses.replace(pretrain.RECIPES["t5-mix-tiny"], optimizer="adafactor")
    params = [torch.nn.Parameter(torch.zeros(3, 2))]
    assert isinstance(pretrain.OPTIMIZERS[recipe.optimizer](params, recipe.lr, recipe.weight_decay),
                      torch.optim.Adafactor)
    with pytest.raises(ValueError, match="optimizer must be one of"):
        dataclasses.replace(recipe, optimizer="sgd")


def test_scoring_after_another_input_is_for_encoder_decoder_models_only():
    batch = (torch.zeros(3, 4, dtype=torch.long), torch.zeros(3, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="encoder-decoder kind"):
        pretrain.heldout_loss(torch.nn.Linear(1, 1), [batch], "gpt-lm", other_input=True)


# ----------------------------------------------------------------------------- the sentence-pair family

def run_pairs(tmp: Path, recipe: str, *args: str) -> dict | None:
    return pretrain.main([recipe, "--out", str(tmp / "out"), "--scratch", str(tmp / "scratch"), *args])


def test_translation_pairs_never_train_on_a_held_out_sentence(data_mirror):
    split = pretrain.translation.split(pretrain.RECIPES["s2s-attention-fra-eng"])
    trained = {" ".join(s) for s, _ in split.train}
    assert split.counts["training_pairs"] == len(split.train) > 100_000
    assert all(len(s) <= 25 and len(t) <= 25 for s, t in split.train)
    assert len(split.heldout) == 2_048
    assert not {" ".join(s) for s, _ in split.heldout} & trained


def test_chatbot_split_is_chapter_4s_split_by_question(data_mirror):
    from lib.data import load_chatbot
    from lib.data.chatbot import heldout_split
    split = pretrain.translation.split(pretrain.RECIPES["chatbot-ko"])
    expected = heldout_split(load_chatbot(), fraction=0.05, seed=0)
    assert len(split.train) == len(expected.train) and len(split.heldout) == len(expected.heldout) < 1_000
    assert not {q for q, _ in split.heldout} & {q for q, _ in split.train}


@pytest.mark.parametrize("recipe", ["s2s-attention-tiny", "chatbot-ko-tiny"])
def test_a_pair_run_resumes_exactly_and_loads_with_its_vocabularies(data_mirror, tmp_path, recipe):
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    result = run_pairs(whole, recipe)
    assert run_pairs(parts, recipe, "--minutes", "0") == {"card": None}          # stops after the first chunk
    run_pairs(parts, recipe)
    a, b = (read_checkpoint(d / "scratch" / recipe / "state.pt") for d in (whole, parts))
    assert a["step"] == b["step"] == 12 and a["history"] == b["history"]
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    card = result["card"]
    assert card["training"]["unit"] == "pairs" and card["training"]["tokens_seen"] == 12 * 8
    assert "12 steps of 8 pairs" in (whole / "out" / recipe / "card.md").read_text()
    ckpt = checkpoints.load(recipe, root=whole / "out")
    loss = pretrain.heldout_loss(ckpt.model, result["heldout"], ckpt.info.kind)
    assert loss == pytest.approx(card["heldout"]["by_stored_dtype"][card["heldout"]["stored_dtype"]], abs=1e-6)
    if recipe.startswith("s2s"):        # a word vocabulary per side, both shipped and registered
        assert set(ckpt.info.files) >= {"tokenizer", "target_tokenizer"}
        assert len(ckpt.tokenizer) == len(ckpt.target_tokenizer) == 200
        assert ckpt.target_tokenizer.encode(["le", "chat"]) != ckpt.tokenizer.encode(["le", "chat"])
    else:                               # one subword vocabulary for questions and answers
        assert "target_tokenizer" not in ckpt.info.files and ckpt.target_tokenizer is None
        assert ckpt.tokenizer.decode(ckpt.tokenizer.encode("영화 볼래 ?")) == "영화 볼래 ?"
    assert ckpt.model.cfg.src_vocab_size == ckpt.tokenizer.vocab_size


def test_a_pair_recipe_must_say_what_it_reads():
    base = pretrain.RECIPES["s2s-attention-tiny"]
    with pytest.raises(ValueError, match="counts pairs"):
        dataclasses.replace(base, kind="gpt-lm")
    with pytest.raises(ValueError, match="a vocabulary for each side"):
        dataclasses.replace(base, target_vocab_size=None)
    with pytest.raises(ValueError, match="schedule must be one of"):
        dataclasses.replace(base, schedule="linear")


def test_every_committed_card_names_the_code_its_invocations_ran():
    # a card's commit and uncommitted-changes flag are its invocations' (the code that trained it), not
    # the commit of whatever rewrote the card later
    cards = sorted(checkpoints.CHECKPOINT_DIR.glob("*/card.json"))
    assert cards
    for file in cards:
        card = json.loads(file.read_text())
        invocations = card["training"]["invocations"]
        version = pretrain.code_version(invocations)
        assert {k: card.get(k) for k in version} == version, file.parent.name


def test_the_bart_chatbot_starts_from_bart_ko_reads_eos_and_never_reads_a_test_pair(data_mirror, tmp_path):
    from lib.data import load_chatbot
    from lib.data.chatbot import heldout_split
    from lib.io import sha256 as file_sha256
    recipe = pretrain.RECIPES["chatbot-bart-tiny"]
    result = run_pairs(tmp_path, "chatbot-bart-tiny")
    card = result["card"]
    # the validation split is drawn from the training questions: no test question on either side
    split = pretrain.translation.split(recipe)
    test = heldout_split(load_chatbot(), fraction=0.05, seed=0)
    test_questions = {test.questions[i] for i in test.heldout}
    assert not test_questions & ({q for q, _ in split.train} | {q for q, _ in split.heldout})
    assert not {q for q, _ in split.heldout} & {q for q, _ in split.train}
    assert card["data"]["counts"]["validation_pairs"] == card["data"]["heldout_tokens"] > 100
    # bart-ko's tokenizer (the same file) and, at step 0, its weights
    ckpt = checkpoints.load("chatbot-bart-tiny", root=tmp_path / "out")
    assert file_sha256(checkpoints.path("chatbot-bart-tiny", "tokenizer", tmp_path / "out")) == \
        checkpoints.info("bart-ko").files["tokenizer"].sha256
    assert card["data"]["init_from"] == {"name": "bart-ko", "weights": True,
                                         "weights_sha256": checkpoints.info("bart-ko").files["weights"].sha256}
    start = pretrain.translation.build_training(recipe, tmp_path / "scratch" / "chatbot-bart-tiny" / "data")[3]
    bart_ko = checkpoints.load("bart-ko").model
    assert all(torch.equal(a, b) for a, b in zip(start.state_dict().values(), bart_ko.state_dict().values()))
    scratch = pretrain.translation.build_training(dataclasses.replace(recipe, init_weights=False),
                                                  tmp_path / "scratch" / "chatbot-bart-tiny" / "data")[3]
    assert not torch.equal(scratch.embed.weight, bart_ko.embed.weight)
    assert ckpt.model.cfg.dropout == 0.1 and ckpt.model.cfg.d_model == bart_ko.cfg.d_model
    # the encoder reads the question and [EOS]
    src, lengths = result["heldout"][0][:2]
    assert all(src[i, n - 1].item() == ckpt.tokenizer.eos_id for i, n in enumerate(lengths.tolist()))
    # the kept weights are the evaluation with the lowest validation loss
    curve = card["heldout"]["curve"]
    assert card["training"]["kept"]["step"] == min(curve, key=lambda c: c["heldout_loss"])["step"]
    loss = pretrain.heldout_loss(ckpt.model, result["heldout"], ckpt.info.kind)
    assert loss == pytest.approx(card["training"]["kept"]["heldout_loss"], abs=2e-3)
    assert "The weights are those of step" in (tmp_path / "out" / "chatbot-bart-tiny" / "card.md").read_text()
    assert f"it kept the weights of step {card['training']['kept']['step']}, the evaluation with the lowest" in \
        checkpoints.summary(ckpt)


def test_keep_best_keeps_the_weights_of_the_lowest_held_out_loss(tmp_path):
    from tools.pretrain import loop
    run_ = loop.Run(pretrain.RECIPES["chatbot-bart-tiny"], 96, [], tmp_path, tmp_path / "out", "cmd")
    model = torch.nn.Linear(2, 1)
    history = train.History()
    for step, loss in ((4, 3.0), (8, 2.0), (12, 2.5)):
        torch.nn.init.constant_(model.weight, step)
        history.records.append({"step": step, "eval_loss": loss})
        loop._keep_if_best(run_, model, history, step)
    kept = loop._restore_best(run_, model)
    assert kept == {"step": 8, "heldout_loss": 2.0} and torch.all(model.weight == 8)


def test_only_a_pair_recipe_starts_from_a_checkpoint_and_keeps_its_best_on_validation():
    base = pretrain.RECIPES["chatbot-bart-tiny"]
    with pytest.raises(ValueError, match="starts from a registered checkpoint"):
        dataclasses.replace(base, init_from=None)
    with pytest.raises(ValueError, match="never on the test pairs"):
        dataclasses.replace(base, validation=0.0)
    with pytest.raises(ValueError, match="share of the training questions"):
        dataclasses.replace(base, validation=0.7)
    with pytest.raises(ValueError, match="validation is for the pair and the review families"):
        dataclasses.replace(pretrain.RECIPES["ko-bert-tiny"], validation=0.1)
    with pytest.raises(ValueError, match="init_from is for the pair family"):
        dataclasses.replace(pretrain.RECIPES["bilstm-tiny"], init_from="bart-ko")


def test_the_t5_task_models_read_chapter_11s_stream_from_t5_mix_and_never_a_test_item(data_mirror, tmp_path):
    from lib.data import text2text
    from lib.io import sha256 as file_sha256
    from tools.pretrain import tasks
    recipe = pretrain.RECIPES["t5-task-tiny"]
    result = run_pairs(tmp_path, "t5-task-tiny")
    card, folder = result["card"], tmp_path / "scratch" / "t5-task-tiny" / "data"
    d = tasks.task_data()
    # no test sentence, review (the NSMC split's: by review id) or question on the training or the
    # validation side; the validation split takes whole sentences, texts and questions
    test_keys = {"translate": set(d.mt_test), "sentiment": {r["review_id"] for r in d.sentiment_test},
                 "chat": {r["q"] for r in d.chat_test}}
    key = {"translate": lambda r: r["en"], "sentiment": lambda r: r["review_id"], "chat": lambda r: r["q"]}
    split_key = {**key, "sentiment": lambda r: r["text"]}
    for task in text2text.TASKS:
        train_keys, val_keys = ({key[task](r) for r in rows} for rows in (d.train[task], d.validation[task]))
        assert not test_keys[task] & (train_keys | val_keys), task
        assert not {split_key[task](r) for r in d.train[task]} & {split_key[task](r) for r in d.validation[task]}
        assert len({split_key[task](r) for r in d.validation[task]}) == text2text.SIZES["val_per_task"]
    # t5-mix's tokenizer (the same file) and, at step 0, its weights; the scratch twin from random ones
    assert file_sha256(checkpoints.path("t5-task-tiny", "tokenizer", tmp_path / "out")) == \
        checkpoints.info("t5-mix").files["tokenizer"].sha256
    start = tasks.build_training(recipe, folder)[3]
    t5_mix = checkpoints.load("t5-mix").model
    assert all(torch.equal(a, b) for a, b in zip(start.state_dict().values(), t5_mix.state_dict().values()))
    scratch = tasks.build_training(dataclasses.replace(recipe, init_weights=False), folder)[3]
    assert not torch.equal(scratch.shared.weight, t5_mix.shared.weight)
    # the multi-task stream takes the tasks in turn; a single-task stream is the same examples of its task
    loader = tasks.build_training(recipe, folder)[1]
    encode = text2text.Encoder(checkpoints.load("t5-mix").tokenizer)
    stream = loader.dataset
    assert len(stream) == recipe.tokens and [stream[i][0][:3] for i in range(3)] == \
        [encode(t, {"en": "x", "other": "", "text": "x", "label": 0, "q": "x", "a": ""})[0][:3] for t in text2text.TASKS]
    alone = text2text.task_stream(d.train, ("sentiment",), recipe.tokens // 3, recipe.seed, encode)
    assert alone == stream[1::3]
    first = d.train["sentiment"][torch.randperm(len(d.train["sentiment"]), generator=torch.Generator().manual_seed(
        text2text.stream_seed("sentiment", 0)))[0].item()]
    assert alone[0] == encode("sentiment", first)
    # the validation loss is the mean of the tasks' own losses, and the kept step is the curve's lowest
    heldout = result["heldout"]
    assert {t for t, _ in heldout} == set(text2text.TASKS)
    ckpt = checkpoints.load("t5-task-tiny", root=tmp_path / "out")
    per_task = [tasks.heldout_loss(ckpt.model, [b for b in heldout if b[0] == t]) for t in text2text.TASKS]
    assert pretrain.heldout_loss(ckpt.model, heldout, "t5-task") == pytest.approx(sum(per_task) / 3, abs=1e-6)
    curve = card["heldout"]["curve"]
    assert card["training"]["kept"]["step"] == min(curve, key=lambda c: c["heldout_loss"])["step"]
    assert card["data"]["counts"]["examples_per_task"] == recipe.tokens // 3


def test_a_t5_task_recipe_names_its_tasks_and_reads_their_corpus():
    base = pretrain.RECIPES["t5-task-tiny"]
    with pytest.raises(ValueError, match="names its tasks"):
        dataclasses.replace(base, tasks=())
    with pytest.raises(ValueError, match="distinct names"):
        dataclasses.replace(base, tasks=("translate", "translate", "chat"))
    with pytest.raises(ValueError, match="a multiple of their number"):
        dataclasses.replace(base, tokens=25)
    with pytest.raises(ValueError, match="names its tasks"):
        dataclasses.replace(pretrain.RECIPES["chatbot-bart-tiny"], tasks=("chat",))


def test_restore_stores_a_pair_checkpoint_smaller_only_when_its_held_out_loss_holds(data_mirror, tmp_path,
                                                                                    monkeypatch):
    from tools.pretrain import card as card_module, restore
    monkeypatch.setattr(card_module, "storage_dtype", lambda losses: "float16")     # trained as before int8
    run_pairs(tmp_path, "s2s-attention-tiny")
    monkeypatch.undo()
    root = tmp_path / "out"
    before = checkpoints.info("s2s-attention-tiny", root)
    trained = json.loads((root / "s2s-attention-tiny" / "card.json").read_text())
    assert trained["heldout"]["stored_dtype"] == "float16"
    float16 = checkpoints.load("s2s-attention-tiny", root=root).model.state_dict()
    assert restore.restore("s2s-attention-tiny", root) == "int8"
    after = checkpoints.info("s2s-attention-tiny", root)
    card = json.loads((root / "s2s-attention-tiny" / "card.json").read_text())
    assert after.files["weights"].size < before.files["weights"].size and card["heldout"]["stored_dtype"] == "int8"
    assert card["restored"]["from"] == "float16" and "Stored again" in (root / "s2s-attention-tiny" / "card.md").read_text()
    ckpt = checkpoints.load("s2s-attention-tiny", root=root)          # the registry's checksums match the files
    for k, v in ckpt.model.state_dict().items():
        assert torch.allclose(v, float16[k], atol=0.02), k
    batches = restore._heldout("s2s-attention-tiny", root)
    loss = pretrain.heldout_loss(ckpt.model, batches, "seq2seq")
    assert abs(loss - trained["heldout"]["by_stored_dtype"]["float32"]) <= pretrain.DTYPE_TOLERANCE
    assert restore.restore("s2s-attention-tiny", root) == "int8"      # nothing smaller: left alone
    assert checkpoints.info("s2s-attention-tiny", root) == after
    # a card whose trained loss the weights do not reproduce: refused, nothing written
    monkeypatch.setattr(restore, "rounded_losses", lambda *a: {d: 9.0 for d in pretrain.DTYPES})
    with pytest.raises(SystemExit, match="no dtype keeps its held-out loss"):
        restore.restore("s2s-attention-tiny", root)
    assert checkpoints.info("s2s-attention-tiny", root) == after
    with pytest.raises(SystemExit, match="an ELMo run's held-out stream"):
        restore._heldout("elmo-ko", checkpoints.CHECKPOINT_DIR)
    with pytest.raises(SystemExit, match="a snapshot is stored"):
        restore.restore("ko-bert@3M", checkpoints.CHECKPOINT_DIR)


def trained_before_int8(tmp_path, monkeypatch, recipe: str) -> tuple[Path, dict]:
    """(the output folder, the card) of ``recipe`` trained with its weights stored in float32."""
    from tools.pretrain import card as card_module
    monkeypatch.setattr(card_module, "storage_dtype", lambda losses: "float32")
    pretrain.main([recipe, "--out", str(tmp_path / "out"), "--scratch", str(tmp_path / "s")])
    monkeypatch.undo()
    return tmp_path / "out", json.loads((tmp_path / "out" / recipe / "card.json").read_text())


def test_restore_rebuilds_a_character_models_held_out_windows(data_mirror, tmp_path, monkeypatch):
    from tools.pretrain import restore
    root, trained = trained_before_int8(tmp_path, monkeypatch, "switch-shakespeare-tiny")
    batches = restore._heldout("switch-shakespeare-tiny", root)   # the windows the run was scored on
    model = checkpoints.load("switch-shakespeare-tiny", root=root).model
    assert pretrain.heldout_loss(model, batches, "switch-gpt") == pytest.approx(
        trained["heldout"]["by_stored_dtype"]["float32"], abs=1e-5)
    before = checkpoints.info("switch-shakespeare-tiny", root).files["weights"].size
    assert restore.restore("switch-shakespeare-tiny", root) != "float32"
    assert checkpoints.info("switch-shakespeare-tiny", root).files["weights"].size < before
    # a vocabulary that is not the text's characters: refused before anything is scored
    tok = root / "switch-shakespeare-tiny" / "tokenizer.json"
    tok.write_text(tok.read_text().replace('"e"', '"E"', 1))
    info = checkpoints.info("switch-shakespeare-tiny", root)
    checkpoints.register(checkpoints.CheckpointInfo(
        name=info.name, kind=info.kind, config=info.config, command=info.command, description=info.description,
        files={**info.files, "tokenizer": checkpoints.file_entry(root, info.files["tokenizer"].path)}), root)
    with pytest.raises(SystemExit, match="another vocabulary"):
        restore._heldout("switch-shakespeare-tiny", root)


def test_restore_rebuilds_a_review_models_validation_batches(data_mirror, tmp_path, monkeypatch):
    from tools.pretrain import restore
    root, trained = trained_before_int8(tmp_path, monkeypatch, "bilstm-tiny")
    batches = restore._heldout("bilstm-tiny", root)       # the validation reviews, encoded again
    _, _, scored, _ = pretrain.loop.build_training(pretrain.RECIPES["bilstm-tiny"], tmp_path / "s" / "bilstm-tiny" / "data")
    assert len(batches) == len(scored) and all(torch.equal(a, b) for x, y in zip(batches, scored) for a, b in zip(x, y))
    model = checkpoints.load("bilstm-tiny", root=root).model
    assert pretrain.heldout_loss(model, batches, "bilstm-classify") == pytest.approx(
        trained["heldout"]["by_stored_dtype"]["float32"], abs=1e-5)
    assert restore.restore("bilstm-tiny", root) != "float32"
    # other training reviews than the card's: refused before anything is scored
    card = root / "bilstm-tiny" / "card.json"
    card.write_text(card.read_text().replace(trained["data"]["corpus_sha256"], "0" * 64))
    with pytest.raises(SystemExit, match="not the ones the checkpoint was trained on"):
        restore._heldout("bilstm-tiny", root)


@pytest.mark.parametrize("recipe", ["ko-bert-tiny", "t5-mix-tiny"])
def test_restore_rebuilds_a_language_models_held_out_documents(data_mirror, tmp_path, monkeypatch, recipe):
    from tools.pretrain import restore
    root, trained = trained_before_int8(tmp_path, monkeypatch, recipe)
    batches = restore._heldout(recipe, root)                 # the held-out documents, encoded again
    _, _, scored, _ = pretrain.loop.build_training(pretrain.RECIPES[recipe], tmp_path / "s" / recipe / "data")
    assert len(batches) == len(scored) and all(torch.equal(a, b) for x, y in zip(batches, scored) for a, b in zip(x, y))
    model = checkpoints.load(recipe, root=root).model
    kind = pretrain.RECIPES[recipe].kind
    assert pretrain.heldout_loss(model, batches, kind) == pytest.approx(
        trained["heldout"]["by_stored_dtype"]["float32"], abs=1e-5)
    assert restore.restore(recipe, root) != "float32"
    card = root / recipe / "card.json"                       # another corpus than the card's: refused
    card.write_text(card.read_text().replace(trained["data"]["corpus_sha256"], "0" * 64))
    with pytest.raises(SystemExit, match="not the one the checkpoint was trained on"):
        restore._heldout(recipe, root)


def test_a_checkpoint_started_from_another_shares_its_tokenizer_file(data_mirror, tmp_path):
    import shutil
    from tools.pretrain import restore
    root = tmp_path / "out"
    run_pairs(tmp_path, "chatbot-bart-tiny")                 # bart-ko is not in this folder: a copy
    copy = root / "chatbot-bart-tiny" / "tokenizer.json"
    assert checkpoints.info("chatbot-bart-tiny", root).files["tokenizer"].path == "chatbot-bart-tiny/tokenizer.json"
    shutil.copytree(checkpoints.CHECKPOINT_DIR / "bart-ko", root / "bart-ko")
    checkpoints.register(checkpoints.info("bart-ko"), root)
    size = copy.stat().st_size
    assert restore.share_tokenizers(root) == size and not copy.exists()
    assert checkpoints.info("chatbot-bart-tiny", root).files["tokenizer"].path == "bart-ko/tokenizer.json"
    assert checkpoints.load("chatbot-bart-tiny", root=root).tokenizer.encode("영화 볼래") == \
        checkpoints.load("bart-ko").tokenizer.encode("영화 볼래")
    # trained into a folder that holds bart-ko: no copy is made at all
    pretrain.main(["chatbot-bart-tiny", "--out", str(root), "--scratch", str(tmp_path / "scratch"), "--fresh"])
    assert checkpoints.info("chatbot-bart-tiny", root).files["tokenizer"].path == "bart-ko/tokenizer.json"
    assert not copy.exists()
    # another run that ships the same bytes in its own folder (a seed, the other arm of a comparison):
    # its copy goes, and the file two entries already name is the one kept, though its path is longer
    twin = root / "twin"
    twin.mkdir()
    shutil.copy(root / "bart-ko" / "tokenizer.json", twin / "tokenizer.json")
    info = checkpoints.info("chatbot-bart-tiny", root)
    checkpoints.register(dataclasses.replace(info, name="twin", files={
        **info.files, "tokenizer": checkpoints.file_entry(root, "twin/tokenizer.json")}), root)
    assert restore.share_tokenizers(root) == size and not (twin / "tokenizer.json").exists()
    assert checkpoints.info("twin", root).files["tokenizer"].path == "bart-ko/tokenizer.json"
    assert checkpoints.info("bart-ko", root).files["tokenizer"].path == "bart-ko/tokenizer.json"
    assert restore.share_tokenizers(root) == 0
