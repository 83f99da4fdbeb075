// Plotly look shared by every chart: run colours, light/dark layout, zoom ranges.

// One colour per run id, the same on every chart and page. Blues, violets, cyans and a grey:
// no green, red, orange or yellow, which would read as "healthy" or "in trouble".
export const PALETTE = ["#3b5bdb", "#ae3ec9", "#1098ad", "#7048e8", "#5f6b7a", "#1c7ed6", "#cc5de8", "#0b7285"];
export const colorFor = (id) => PALETTE[Math.abs(Number(id)) % PALETTE.length];

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
