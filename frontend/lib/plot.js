// Plotly look shared by every chart: run colours, light/dark layout, zoom ranges.

// One colour per run id, the same on every chart and page. Blues, violets, cyans and a grey:
// no green, red, orange or yellow, which would read as "healthy" or "in trouble". Neighbours in the
// list differ in hue or lightness, so consecutive ids never look alike.
export const PALETTE = [
  "#3b5bdb", // blue
  "#0b7285", // dark teal
  "#ae3ec9", // grape
  "#868e96", // grey
  "#4dabf7", // sky
  "#5f3dc4", // violet
  "#15aabf", // cyan
  "#748ffc", // light indigo
  "#da77f2", // light grape
  "#364fc7", // deep blue
];
const assigned = new Map(); // run id -> colour, where a page shows runs side by side (assignColors)
export const colorFor = (id) => assigned.get(Number(id)) ?? PALETTE[Math.abs(Number(id)) % PALETTE.length];

// Runs shown together get different colours (up to the palette's 10): each keeps its id's colour
// unless an earlier run took it, then takes the next free one.
export function assignColors(ids) {
  assigned.clear();
  const taken = new Set();
  for (const id of ids) {
    let i = Math.abs(Number(id)) % PALETTE.length;
    for (let n = 0; n < PALETTE.length && taken.has(i); n++) i = (i + 1) % PALETTE.length;
    taken.add(i);
    assigned.set(Number(id), PALETTE[i]);
  }
}

export const dark = () => window.matchMedia?.("(prefers-color-scheme: dark)").matches;
export function plotLayout(extra = {}) {
  const fg = dark() ? "#e6e9ef" : "#1d2330",
    grid = dark() ? "#2a2f3a" : "#e4e7ec";
  return Object.assign(
    {
      margin: { l: 56, r: 16, t: 8, b: 36 },
      paper_bgcolor: "rgba(0,0,0,0)",
      plot_bgcolor: "rgba(0,0,0,0)",
      font: { color: fg, size: 11 },
      showlegend: true,
      legend: { orientation: "h", y: -0.2 },
      xaxis: { gridcolor: grid, zeroline: false },
      yaxis: { gridcolor: grid, zeroline: false },
      hovermode: "x unified",
    },
    extra,
  );
}

// The new x range of a plotly_relayout event (a drag sends range[0]/[1], code may send the array).
export const xRange = (ev) => ev["xaxis.range"] || [ev["xaxis.range[0]"], ev["xaxis.range[1]"]];
