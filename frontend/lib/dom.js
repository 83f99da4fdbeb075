// DOM helpers shared by every page. User data is always rendered with textContent (el()).

export const $ = (id) => document.getElementById(id);

export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (v !== undefined && v !== null) node.setAttribute(k, v);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

// Calls onChange(visible) when an element scrolls into or out of view (live redraws skip hidden charts).
export function onVisible(element, onChange) {
  if ("IntersectionObserver" in window)
    new IntersectionObserver((seen) => onChange(seen[seen.length - 1].isIntersecting)).observe(element);
}

// Runs fn at most once per minMs, or `factor` x its own last duration when that is more, so that
// redraws never take over the page on big runs or slow machines. Returns schedule(). A named one
// reports its durations to window.__gwFlushMs when a benchmark sets it.
export function throttle(fn, minMs = 150, factor = 3, name = "") {
  let timer = null,
    lastMs = 0;
  return () => {
    if (timer) return;
    timer = setTimeout(
      () =>
        requestAnimationFrame(() => {
          timer = null;
          const t = performance.now();
          fn();
          lastMs = performance.now() - t;
          if (window.__gwFlushMs && name) window.__gwFlushMs.push(lastMs); // benchmarks/bench_pages.py listens here
        }),
      Math.max(minMs, factor * lastMs),
    );
  };
}
