"""lib.viz.attention_explorer (the checked JSON it embeds, the page it makes in a browser) and
lib.viz.attention_grid (every head of every layer)."""
import json
import re
import shutil

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from lib import viz
from lib.models.transformer import Transformer, TransformerConfig

NASTY = ["</script>", "<b>bold</b>", "a&amp;b", "<!--", "\u2028x"]


def softmax_weights(*shape, seed=0):
    return torch.softmax(torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 2, dim=-1)


def embedded(explorer) -> dict:
    """The JSON an explorer's HTML carries, parsed."""
    found = re.findall(r'<script type="application/json" id="([^"]+)-data">(.*?)</script>', explorer.data, re.S)
    assert len(found) == 1
    return json.loads(found[0][1])


def test_the_embedded_json_holds_the_weights_and_tokens():
    src, tgt = list("abcde"), ["[BOS]", "x", "y", "z"]
    w = {"encoder_self": softmax_weights(2, 3, 5, 5), "decoder_self": softmax_weights(2, 3, 4, 4, seed=1),
         "cross": softmax_weights(2, 3, 4, 5, seed=2)}
    data = embedded(viz.attention_explorer(w, source_tokens=src, target_tokens=tgt))
    assert [k["name"] for k in data["kinds"]] == list(w)
    for kind in data["kinds"]:
        got = np.array(kind["weights"])
        assert got.shape == tuple(w[kind["name"]].shape)
        np.testing.assert_allclose(got, w[kind["name"]].numpy(), atol=5e-5)   # rounded to 4 decimals
        np.testing.assert_allclose(got.sum(-1), 1.0, atol=1e-3)
    cross = data["kinds"][2]
    assert cross["queries"] == tgt and cross["keys"] == src
    assert data["kinds"][0]["queries"] == data["kinds"][0]["keys"] == src


def test_a_models_attention_weights_go_in_as_they_come_out():
    cfg = TransformerConfig(src_vocab_size=20, tgt_vocab_size=20, d_model=16, num_heads=2, num_encoder_layers=2,
                            num_decoder_layers=2, d_ff=32, max_len=16)
    torch.manual_seed(0)
    model = Transformer(cfg)
    src, tgt = torch.tensor([[5, 6, 7]]), torch.tensor([[2, 8, 9, 10]])
    maps = model.attention_weights(src, tgt)        # {kind: [per layer (1, H, Tq, Tk)]}
    data = viz.attention_explorer_data(maps, source_tokens=["a", "b", "c"], target_tokens=["B", "x", "y", "z"])
    dec = np.array(data["kinds"][1]["weights"])
    assert dec.shape == (2, 2, 4, 4)
    np.testing.assert_allclose(dec, torch.stack([m[0] for m in maps["decoder_self"]]).numpy(), atol=5e-5)
    assert np.all(np.triu(dec, k=1) == 0), "decoder self-attention must not look ahead"


@pytest.mark.parametrize("weights, tokens, error, match", [
    ({"cross": softmax_weights(2, 3, 4, 5)}, dict(source_tokens=list("abcd"), target_tokens=list("wxyz")),
     ValueError, r"keys=5.*4 source tokens"),
    ({"cross": softmax_weights(3, 4, 5)}, dict(source_tokens=list("abcde"), target_tokens=list("wxyz")),
     ValueError, r"\(layers, heads, queries, keys\), got shape \(3, 4, 5\)"),
    ({"cross": [softmax_weights(1, 2, 4, 5), softmax_weights(1, 3, 4, 5)]},
     dict(source_tokens=list("abcde"), target_tokens=list("wxyz")), ValueError, "differ in shape"),
    ({"self": softmax_weights(1, 1, 2, 2)}, dict(source_tokens=list("ab")), ValueError, "unknown attention kind"),
    ({"cross": softmax_weights(1, 1, 2, 2)}, dict(source_tokens=list("ab")), ValueError, "needs target_tokens"),
    ({"encoder_self": torch.rand(1, 1, 2, 2) + 0.6}, dict(source_tokens=list("ab")), ValueError, "sum to 1"),
    ({"encoder_self": torch.tensor([[[[1.5, -0.5], [0.5, 0.5]]]])}, dict(source_tokens=list("ab")),
     ValueError, "non-negative"),
    ({"encoder_self": torch.tensor([[[[float("nan"), 1.0], [0.5, 0.5]]]])}, dict(source_tokens=list("ab")),
     ValueError, "finite"),
    ({"encoder_self": softmax_weights(1, 1, 2, 2)}, dict(source_tokens="ab"), TypeError, "list of strings"),
    ({}, dict(source_tokens=list("ab")), TypeError, "non-empty dict"),
    ({"encoder_self": "weights"}, dict(source_tokens=list("ab")), TypeError, "array or tensor"),
])
def test_bad_input_gets_a_clear_error(weights, tokens, error, match):
    with pytest.raises(error, match=match):
        viz.attention_explorer(weights, **tokens)


def test_all_masked_rows_are_allowed():
    w = softmax_weights(1, 2, 3, 3)
    w[:, :, 2] = 0.0    # a query whose keys are all masked: lib.attention gives an all-zero row
    data = viz.attention_explorer_data({"encoder_self": w}, source_tokens=list("abc"))
    assert np.array(data["kinds"][0]["weights"])[:, :, 2].sum() == 0


def test_tokens_cannot_break_out_of_the_page_and_ids_are_unique():
    w = {"encoder_self": softmax_weights(1, 2, len(NASTY), len(NASTY))}
    a = viz.attention_explorer(w, source_tokens=NASTY, title="<i>title</i>")
    b = viz.attention_explorer(w, source_tokens=NASTY)
    for page in (a.data, b.data):
        assert page.count("</script>") == 2 and page.count("<script") == 2   # only our own two elements
        assert "<b>bold" not in page and "<!--" not in page and "<i>title" not in page
        assert embedded(a)["kinds"][0]["keys"] == NASTY
    ids_a, ids_b = set(re.findall(r'id="([^"]+)"', a.data)), set(re.findall(r'id="([^"]+)"', b.data))
    assert ids_a and not ids_a & ids_b


def test_attention_grid_draws_every_head_of_every_layer_on_one_scale():
    w = softmax_weights(2, 3, 4, 5)
    fig = viz.attention_grid(list(w[:, None]), x_labels=list("abcde"), y_labels=list("wxyz"), title="t")
    try:
        maps = [ax for ax in fig.axes if ax.images]
        assert [ax.get_title() for ax in maps] == [f"layer {l}, head {h}" for l in (1, 2) for h in (1, 2, 3)]
        for i, ax in enumerate(maps):
            np.testing.assert_allclose(ax.images[0].get_array(), w[i // 3, i % 3].numpy(), atol=1e-6)
            assert ax.images[0].get_clim() == (0.0, 1.0)
        assert [t.get_text() for t in maps[-1].get_xticklabels()] == list("abcde")
        # three heads in rows of two: layer 1 on rows 0-1, layer 2 on rows 2-3, one empty place each
        fig2 = viz.attention_grid(w, x_labels=list("abcde"), columns=2)
        shown = [ax for ax in fig2.axes if ax.images]
        assert [ax.get_title() for ax in shown] == [f"layer {l}, head {h}" for l in (1, 2) for h in (1, 2, 3)]
        assert sum(not ax.get_visible() for ax in fig2.axes) == 2
        for i, ax in enumerate(shown):
            np.testing.assert_allclose(ax.images[0].get_array(), w[i // 3, i % 3].numpy(), atol=1e-6)
        with pytest.raises(ValueError, match="columns"):
            viz.attention_grid(w, columns=0)
        with pytest.raises(ValueError, match=r"\(layers, heads, queries, keys\), got shape \(3, 4, 5\)"):
            viz.attention_grid(w[0])
        with pytest.raises(ValueError, match="y_labels has 3 labels"):
            viz.attention_grid(w, y_labels=list("xyz"))
    finally:
        plt.close("all")


# ---------------------------------------------------------------------------- in a browser

def _launch(playwright):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium is not installed (bash tools/setup.sh --browser)")
    return playwright.chromium.launch(executable_path=chromium, args=["--disable-gpu"])


def shown_weights(page, root_id):
    return page.eval_on_selector_all(f"#{root_id} .attnx-key .attnx-w", "els => els.map(e => Number(e.textContent))")


def test_hovering_a_token_shows_its_weights_in_a_browser(tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api")
    tgt = ["[BOS]", "x", "y"]
    first = viz.attention_explorer({"cross": softmax_weights(2, 3, 3, len(NASTY))}, source_tokens=NASTY,
                                   target_tokens=tgt)
    second = viz.attention_explorer({"encoder_self": softmax_weights(2, 3, len(NASTY), len(NASTY), seed=3),
                                     "cross": softmax_weights(2, 3, 3, len(NASTY), seed=4)},
                                    source_tokens=NASTY, target_tokens=tgt)
    path = tmp_path / "explorers.html"
    path.write_text(f"<!DOCTYPE html><html><head><meta charset='utf-8'></head><body>{first.data}<p>between</p>"
                    f"{second.data}</body></html>", encoding="utf-8")
    ids = [re.search(r'id="(attnx-[^"]+)"', e.data).group(1) for e in (first, second)]
    data = [embedded(e) for e in (first, second)]
    with sync_api.sync_playwright() as p:
        browser = _launch(p)
        try:
            page = browser.new_page()
            problems = []
            page.on("pageerror", lambda e: problems.append(str(e)))
            page.on("console", lambda m: m.type == "error" and problems.append(m.text))
            page.goto(path.as_uri())
            for i in ids:
                assert page.get_attribute(f"#{i}", "data-ready") == "true"
            # the tokens are shown as text, markup and all
            keys = page.eval_on_selector_all(f"#{ids[1]} .attnx-key .attnx-text", "els => els.map(e => e.textContent)")
            assert keys == NASTY
            before_first = shown_weights(page, ids[0])
            # second explorer, encoder self-attention, layer 2, head 3, hover query 4
            page.select_option(f"#{ids[1]} .attnx-layer", "1")
            page.select_option(f"#{ids[1]} .attnx-head", "2")
            page.hover(f"#{ids[1]} .attnx-query >> nth=3")
            row = np.array(data[1]["kinds"][0]["weights"][1][2][3])
            np.testing.assert_allclose(shown_weights(page, ids[1]), row, atol=6e-4)
            # all heads: the mean over heads
            page.select_option(f"#{ids[1]} .attnx-head", "mean")
            mean = np.array(data[1]["kinds"][0]["weights"][1])[:, 3].mean(0)
            np.testing.assert_allclose(shown_weights(page, ids[1]), mean, atol=6e-4)
            # another kind: cross-attention, the target tokens are the queries
            page.select_option(f"#{ids[1]} .attnx-kind", "1")
            page.select_option(f"#{ids[1]} .attnx-head", "0")
            page.hover(f"#{ids[1]} .attnx-query >> nth=2")
            np.testing.assert_allclose(shown_weights(page, ids[1]), data[1]["kinds"][1]["weights"][0][0][2], atol=6e-4)
            queries = page.eval_on_selector_all(f"#{ids[1]} .attnx-query .attnx-text", "els => els.map(e => e.textContent)")
            assert queries == tgt
            # the keyboard does what the mouse does
            page.focus(f"#{ids[1]} .attnx-query >> nth=0")
            np.testing.assert_allclose(shown_weights(page, ids[1]), data[1]["kinds"][1]["weights"][0][0][0], atol=6e-4)
            # the first explorer was left alone (no shared ids or state)
            assert shown_weights(page, ids[0]) == before_first
            np.testing.assert_allclose(before_first, np.array(data[0]["kinds"][0]["weights"][0])[:, 0].mean(0),
                                       atol=6e-4)
            assert not problems, problems
        finally:
            browser.close()
