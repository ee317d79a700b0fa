// Scroll cues: every box on the page that scrolls (a code cell or an output with long lines, a
// long log or results table shown in a box of its own height, a wide table, a long equation)
// gets the class course-scroll, and course.css shades the edges where more is hidden
// (course-scroll-left, -right, -up, -down). Marked after the page loads, after MathJax has
// typeset (equations get their width then), when the fonts are ready, on resize and on scroll.
(function () {
  "use strict";
  const SCROLLS = new Set(["auto", "scroll"]);

  function update(el) {
    const wide = el.scrollWidth - el.clientWidth, tall = el.scrollHeight - el.clientHeight;
    el.classList.toggle("course-scroll-left", el.scrollLeft > 1);
    el.classList.toggle("course-scroll-right", wide > 1 && el.scrollLeft < wide - 1);
    el.classList.toggle("course-scroll-up", el.scrollTop > 1);
    el.classList.toggle("course-scroll-down", tall > 1 && el.scrollTop < tall - 1);
  }

  function scrolls(el) {
    const cs = getComputedStyle(el);
    return (el.scrollWidth > el.clientWidth + 1 && SCROLLS.has(cs.overflowX))
        || (el.scrollHeight > el.clientHeight + 1 && SCROLLS.has(cs.overflowY));
  }

  function mark() {
    const main = document.querySelector(".bd-main") || document.body;
    for (const el of main.querySelectorAll("*")) {
      if (el.clientWidth === 0 || (el.parentElement && el.parentElement.closest("mjx-container"))) continue;
      const over = el.scrollWidth > el.clientWidth + 1 || el.scrollHeight > el.clientHeight + 1;
      const marked = el.classList.contains("course-scroll");
      if (!over && !marked) continue;
      if (over && scrolls(el)) {
        if (!marked) {
          el.classList.add("course-scroll");
          el.addEventListener("scroll", () => update(el), {passive: true});
        }
        update(el);
      } else if (marked) {
        el.classList.remove("course-scroll", "course-scroll-left", "course-scroll-right",
                            "course-scroll-up", "course-scroll-down");
      }
    }
  }

  let pending = null;
  function later() {
    if (pending) cancelAnimationFrame(pending);
    pending = requestAnimationFrame(() => { pending = null; mark(); });
  }
  window.addEventListener("load", () => {
    mark();
    if (window.MathJax && MathJax.startup && MathJax.startup.promise) MathJax.startup.promise.then(later);
    if (document.fonts) document.fonts.ready.then(later);
  });
  window.addEventListener("resize", later);
})();
