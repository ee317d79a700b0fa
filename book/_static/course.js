// Scroll cues: every box on the page that scrolls sideways (a code cell or an output with long
// lines, a wide table, a long display equation) gets the class course-scroll, and course.css
// draws a shadow on the edge where more is hidden (right, left or both). Marked after the page
// loads, after MathJax has typeset (equations get their width then), on resize and on scroll.
(function () {
  "use strict";
  const SCROLLS = new Set(["auto", "scroll"]);

  function update(el) {
    const more = el.scrollWidth - el.clientWidth;
    el.classList.toggle("course-scroll-left", el.scrollLeft > 1);
    el.classList.toggle("course-scroll-right", el.scrollLeft < more - 1);
  }

  function mark() {
    const main = document.querySelector(".bd-main") || document.body;
    for (const el of main.querySelectorAll("*")) {
      if (el.clientWidth === 0 || (el.parentElement && el.parentElement.closest("mjx-container"))) continue;
      const over = el.scrollWidth > el.clientWidth + 1;
      if (!over && !el.classList.contains("course-scroll")) continue;
      if (over && SCROLLS.has(getComputedStyle(el).overflowX)) {
        if (!el.classList.contains("course-scroll")) {
          el.classList.add("course-scroll");
          el.addEventListener("scroll", () => update(el), {passive: true});
        }
        update(el);
      } else if (!over) {
        el.classList.remove("course-scroll", "course-scroll-left", "course-scroll-right");
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
