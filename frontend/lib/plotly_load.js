// Plotly (3.5 MB, 1-2 s of parse and start-up) on a page that draws before it: the run page preloads
// the file, draws its first charts with quickchart.js, then runs Plotly (loadPlotly). Modules that draw
// with Plotly wait for it (whenPlotly); on pages with a plain <script> for it, it is there at once.

const SRC = "/static/vendor/plotly.min.js";
let ready = null,
  settle = null;

// Resolves with window.Plotly once it has run.
export function whenPlotly() {
  if (window.Plotly) return Promise.resolve(window.Plotly);
  ready ??= new Promise((resolve, reject) => {
    settle = { resolve, reject };
  });
  return ready;
}

// Runs Plotly once, after the next paint: what was drawn before shows while Plotly starts up.
export function loadPlotly() {
  const got = whenPlotly();
  if (window.Plotly || document.querySelector(`script[src="${SRC}"]`)) return got;
  const script = Object.assign(document.createElement("script"), { src: SRC });
  script.onload = () => settle.resolve(window.Plotly);
  script.onerror = () => settle.reject(new Error("could not load " + SRC));
  requestAnimationFrame(() => setTimeout(() => document.head.append(script), 0));
  return got;
}
