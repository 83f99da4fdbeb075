// The run page's media panel (frontend/pages/run/media.js): histograms over steps (a bins x steps heatmap and one step's bars, with
// NaN/inf counts), images and tables at a step chosen with a slider, and what the script set in run.summary.
// Self-contained (its own tiny helpers): user text is always rendered with textContent.

const node = (tag, attrs = {}, ...children) => {
  const n = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") n.className = v;
    else if (k.startsWith("on")) n.addEventListener(k.slice(2), v);
    else if (v !== undefined && v !== null) n.setAttribute(k, v);
  }
  for (const c of children) if (c !== null && c !== undefined) n.append(c instanceof Node ? c : String(c));
  return n;
};
const json = async (url) => {
  const r = await fetch(url);
  if (!r.ok) throw new Error(`${r.status} ${url}`);
  return r.json();
};
const q = (key) => encodeURIComponent(key);
const ROWS = 48; // heatmap rows: every step's bins resampled onto one value grid

// Mounts the panel in `box` (hidden while the run has no media and no summary); returns a refresh().
export function mountMedia(box, runId) {
  const refresh = async () => {
    const [media, summary] = await Promise.all([
      json(`/api/runs/${runId}/media`).catch(() => []),
      json(`/api/runs/${runId}/summary`).catch(() => ({})),
    ]);
    box.replaceChildren();
    box.hidden = !media.length && !Object.keys(summary).length;
    if (Object.keys(summary).length) box.append(summaryCard(summary));
    for (const m of media) {
      const card = node("div", { class: "card wide media-card", "data-key": m.key, "data-kind": m.kind });
      card.append(node("h3", {}, m.key, " ", node("span", { class: "muted" }, `${m.kind} · ${m.steps} step(s)`)));
      box.append(card);
      if (m.kind === "histogram") histogramView(card, runId, m.key);
      else stepView(card, runId, m);
    }
  };
  refresh();
  return refresh;
}

function summaryCard(summary) {
  const dl = node("dl", { class: "kv", id: "run-summary" });
  for (const [k, v] of Object.entries(summary).sort()) {
    dl.append(node("dt", {}, k), node("dd", {}, typeof v === "object" ? JSON.stringify(v) : String(v)));
  }
  return node("div", { class: "card media-card" }, node("h3", {}, "Summary"), dl);
}

function slider(steps, onPick) {
  const label = node("span", { class: "muted step-label" });
  const input = node("input", { type: "range", min: 0, max: Math.max(0, steps.length - 1), value: steps.length - 1 });
  const pick = () => {
    label.textContent = `step ${steps[Number(input.value)]}`;
    onPick(steps[Number(input.value)]);
  };
  input.addEventListener("input", pick);
  return { el: node("label", { class: "media-slider" }, "step ", input, " ", label), pick, input };
}

// Bins of one histogram as (centre, count) pairs, from its lo/hi (even bins) or its edges.
function bins(h) {
  const n = h.counts.length;
  const edges = h.edges || Array.from({ length: n + 1 }, (_, i) => h.lo + ((h.hi - h.lo) * i) / n);
  return h.counts.map((c, i) => [(edges[i] + edges[i + 1]) / 2, c, edges[i], edges[i + 1]]);
}

async function histogramView(card, runId, key) {
  const data = await json(`/api/runs/${runId}/histograms?key=${q(key)}&max_steps=400`);
  const hs = data.histograms;
  if (!hs.length) return;
  const lo = Math.min(...hs.map((h) => (h.edges ? h.edges[0] : h.lo)));
  const hi = Math.max(...hs.map((h) => (h.edges ? h.edges[h.edges.length - 1] : h.hi)));
  const width = hi > lo ? (hi - lo) / ROWS : 1;
  const ys = Array.from({ length: ROWS }, (_, i) => lo + width * (i + 0.5));
  const z = ys.map(() => hs.map(() => 0));
  hs.forEach((h, col) => {
    for (const [centre, count] of bins(h)) {
      const row = Math.min(ROWS - 1, Math.max(0, Math.floor((centre - lo) / width)));
      z[row][col] += count;
    }
  });
  const heat = node("div", { class: "chart histogram-heatmap" });
  const bars = node("div", { class: "chart histogram-bars" });
  const counts = node("div", { class: "muted nonfinite" });
  card.append(heat);
  const steps = hs.map((h) => h.step);
  const s = slider(steps, (step) => {
    const h = hs[steps.indexOf(step)];
    const b = bins(h);
    counts.textContent = `step ${h.step}: NaN ${h.nan} · +inf ${h.inf} · -inf ${h.ninf}`;
    counts.dataset.nan = h.nan;
    if (window.Plotly) {
      window.Plotly.react(bars, [{ type: "bar", x: b.map((v) => v[0]), y: b.map((v) => v[1]) }], {
        margin: { t: 10, r: 10, b: 30, l: 40 },
        height: 180,
        bargap: 0,
      });
    }
  });
  card.append(s.el, counts, bars);
  if (window.Plotly) {
    window.Plotly.newPlot(
      heat,
      [{ type: "heatmap", x: steps, y: ys, z: z.map((r) => r.map((c) => (c ? Math.log10(1 + c) : null))) }],
      { margin: { t: 10, r: 10, b: 30, l: 50 }, height: 240, xaxis: { title: "step" } },
      { displaylogo: false },
    );
  }
  s.pick();
}

async function stepView(card, runId, m) {
  const path = m.kind === "image" ? "images" : "tables";
  const first = await json(`/api/runs/${runId}/${path}?key=${q(m.key)}`);
  const body = node("div", { class: "media-body" });
  const show = async (step) => {
    const got = await json(`/api/runs/${runId}/${path}?key=${q(m.key)}&step=${step}`);
    body.replaceChildren(m.kind === "image" ? images(runId, got) : m.kind === "table" ? table(got) : text(got));
    body.dataset.step = got.step;
  };
  const s = slider(first.steps, show);
  card.append(s.el, body);
  s.pick();
}

function images(runId, got) {
  const row = node("div", { class: "media-images" });
  for (const im of got.images) {
    const fig = node("figure", {});
    fig.append(
      node("img", {
        src: `/api/runs/${runId}/images/${im.id}.png`,
        width: im.width,
        height: im.height,
        alt: im.caption || "",
      }),
    );
    if (im.caption) fig.append(node("figcaption", {}, im.caption));
    row.append(fig);
  }
  return row;
}

function text(got) {
  return node("pre", { class: "media-text" }, got.text);
}

// A table sorted by a column when its header is clicked (again: the other way).
function table(got) {
  const tbl = node("table", { class: "media-table" });
  let rows = got.rows.slice();
  let by = -1,
    dir = 1;
  const body = node("tbody");
  const draw = () => {
    body.replaceChildren(
      ...rows.map((r) =>
        node("tr", {}, ...got.columns.map((_, i) => node("td", {}, r[i] === null ? "" : String(r[i])))),
      ),
    );
  };
  const head = node(
    "tr",
    {},
    ...got.columns.map((c, i) =>
      node(
        "th",
        {
          onclick: () => {
            dir = by === i ? -dir : 1;
            by = i;
            rows = rows.slice().sort((a, b) => cmp(a[i], b[i]) * dir);
            draw();
          },
        },
        c,
      ),
    ),
  );
  tbl.append(node("thead", {}, head), body);
  draw();
  return tbl;
}

function cmp(a, b) {
  if (typeof a === "number" && typeof b === "number") return a - b;
  if (a === null || a === undefined) return 1;
  if (b === null || b === undefined) return -1;
  return String(a).localeCompare(String(b));
}
