// Search result snippets with typeset formulas instead of their LaTeX source.
//
// Sphinx's search page (searchtools.js) shows, under each result, 240 characters of the page's
// text around the search word: the text content of the page, where a formula is its source,
// "\(\mathrm{softmax}(QK^\top)\)". This file replaces Search.makeSearchSummary (searchtools.js
// calls it through the Search object) by one that cuts the same window but keeps each formula
// whole, as one element holding its TeX, and typesets those with the MathJax the site serves
// (course_site.py adds it to the search page). The window is measured with every formula counted
// as one character, so a formula is never cut in half.
(function () {
  "use strict";
  if (typeof Search === "undefined") return;
  const FIRST = 0xe000;  // formulas stand in the text as private-use characters while it is cut
  const SLOT = /[\ue000-\uf8ff]/;

  function tex(source) {  // "\(x\)" or "\[x\]" or "\begin{align}..." -> the TeX inside
    const s = source.trim();
    const m = s.match(/^\\\(([\s\S]*)\\\)$/) || s.match(/^\\\[([\s\S]*)\\\]$/) || s.match(/^\$\$([\s\S]*)\$\$$/);
    return (m ? m[1] : s).trim();
  }

  function typeset(summary) {
    const spans = Array.from(summary.querySelectorAll("span.search-math"));
    if (!spans.length || !window.MathJax || !MathJax.startup) {
      summary.dataset.math = "none";
      return;
    }
    MathJax.startup.promise
      .then(() => Promise.all(spans.map((span) => MathJax.tex2chtmlPromise(span.dataset.tex, { display: false })
        .then((node) => { span.textContent = ""; span.appendChild(node); }))))
      .then(() => { MathJax.startup.document.clear(); MathJax.startup.document.updateDocument(); })
      .catch((err) => console.warn("search snippet math:", err))
      .finally(() => { summary.dataset.math = "typeset"; });
  }

  Search.makeSearchSummary = (htmlText, keywords, anchor) => {
    const doc = new DOMParser().parseFromString(htmlText, "text/html");
    const formulas = [];
    doc.querySelectorAll(".math").forEach((el) => {
      if (formulas.length >= 0xf8ff - FIRST) return;
      el.querySelectorAll(".eqno, .headerlink").forEach((n) => n.remove());  // "(1)" of a numbered equation
      formulas.push(tex(el.textContent));
      el.replaceWith(doc.createTextNode(String.fromCharCode(FIRST + formulas.length - 1)));
    });
    const text = Search.htmlToText(doc.documentElement.outerHTML, anchor);
    if (text === "") return null;

    // the window of searchtools.js: 120 characters before the last search word found, 240 in all
    const lower = text.toLowerCase();
    const at = [...keywords].map((k) => lower.indexOf(k.toLowerCase())).filter((i) => i > -1).slice(-1)[0];
    const start = Math.max(at - 120, 0);
    const shown = text.substr(start, 240).trim();

    const summary = document.createElement("p");
    summary.classList.add("context");
    if (start > 0) summary.appendChild(document.createTextNode("..."));
    for (const part of shown.split(/([\ue000-\uf8ff])/)) {
      if (!part) continue;
      if (SLOT.test(part) && part.length === 1) {
        const span = summary.appendChild(document.createElement("span"));
        span.className = "search-math";
        span.dataset.tex = formulas[part.charCodeAt(0) - FIRST];
        span.textContent = "\u2026";  // until MathJax has drawn it
      } else {
        summary.appendChild(document.createTextNode(part));
      }
    }
    if (start + 240 < text.length) summary.appendChild(document.createTextNode("..."));
    // searchtools.js appends the summary right after this returns
    setTimeout(() => typeset(summary), 0);
    return summary;
  };
})();
