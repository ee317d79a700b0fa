// The attention explorer of lib.viz.attention_explorer: plain JavaScript, no library, no
// request. Python writes, per explorer, a root element with a unique id, the weights as JSON in a
// script element of type application/json with the id ROOT-data, then this code, called
// with that id. Token text only ever reaches the page through textContent (never innerHTML).
(function (rootId) {
  "use strict";
  const root = document.getElementById(rootId);
  const data = JSON.parse(document.getElementById(rootId + "-data").textContent);
  const kindSel = root.querySelector(".attnx-kind");
  const layerSel = root.querySelector(".attnx-layer");
  const headSel = root.querySelector(".attnx-head");
  const queryRow = root.querySelector(".attnx-queries");
  const keyRow = root.querySelector(".attnx-keys");
  const readout = root.querySelector(".attnx-readout");
  let current = 0;  // the query token shown

  function option(select, value, label) {
    const o = document.createElement("option");
    o.value = String(value);
    o.textContent = label;
    select.appendChild(o);
  }

  function kind() { return data.kinds[Number(kindSel.value)]; }

  // one row of weights: query q of the selected layer and head ("mean": the heads averaged)
  function row(q) {
    const k = kind(), layer = k.weights[Number(layerSel.value)];
    if (headSel.value !== "mean") return layer[Number(headSel.value)][q];
    const out = new Array(k.keys.length).fill(0);
    for (const head of layer) head[q].forEach((w, j) => { out[j] += w / layer.length; });
    return out;
  }

  function token(text, cls) {
    const span = document.createElement("span");
    span.className = cls;
    const t = document.createElement("span");
    t.className = "attnx-text";
    t.textContent = text;
    span.appendChild(t);
    return span;
  }

  function show(q) {
    current = q;
    const k = kind(), w = row(q), top = Math.max(...w, 1e-12);
    Array.from(queryRow.children).forEach((el, i) => el.classList.toggle("attnx-active", i === q));
    Array.from(keyRow.children).forEach((el, j) => {
      el.style.backgroundColor = `rgba(230, 85, 13, ${(w[j] / top).toFixed(3)})`;
      el.dataset.weight = String(w[j]);
      el.querySelector(".attnx-w").textContent = w[j].toFixed(3);
      el.title = `${k.keys[j]}: ${w[j].toFixed(4)}`;
    });
    const head = headSel.value === "mean" ? "all heads (mean)" : `head ${Number(headSel.value) + 1}`;
    readout.textContent = `query ${q + 1} “${k.queries[q]}”, layer ${Number(layerSel.value) + 1}, ${head}: ` +
      `its weights over the ${k.keys.length} keys sum to ${w.reduce((a, b) => a + b, 0).toFixed(3)}`;
  }

  function build() {
    const k = kind();
    layerSel.textContent = "";
    k.weights.forEach((_, i) => option(layerSel, i, `layer ${i + 1}`));
    const heads = k.weights[0].length;
    headSel.textContent = "";
    option(headSel, "mean", "all heads (mean)");
    for (let h = 0; h < heads; h++) option(headSel, h, `head ${h + 1}`);
    queryRow.textContent = "";
    keyRow.textContent = "";
    k.queries.forEach((text, i) => {
      const el = queryRow.appendChild(token(text, "attnx-token attnx-query"));
      el.tabIndex = 0;  // reachable with the keyboard: focus shows the weights as hovering does
      el.addEventListener("mouseenter", () => show(i));
      el.addEventListener("focus", () => show(i));
    });
    k.keys.forEach((text) => {
      const el = keyRow.appendChild(token(text, "attnx-token attnx-key"));
      const w = document.createElement("span");
      w.className = "attnx-w";
      el.appendChild(w);
    });
    root.querySelector(".attnx-qlabel").textContent = k.query_label;
    root.querySelector(".attnx-klabel").textContent = k.key_label;
    show(Math.min(current, k.queries.length - 1));
  }

  data.kinds.forEach((k, i) => option(kindSel, i, k.label));
  kindSel.addEventListener("change", () => { current = 0; build(); });
  layerSel.addEventListener("change", () => show(current));
  headSel.addEventListener("change", () => show(current));
  build();
  root.dataset.ready = "true";
})
