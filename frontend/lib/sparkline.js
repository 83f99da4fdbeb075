// A small inline SVG curve of one series (the runs list's loss column): no Plotly on that page.
const NS = "http://www.w3.org/2000/svg";

// Non-finite points are left out; a curve spanning more than 3 decades is drawn on a log scale, so
// a diverging run reads as "blew up" and the others are not flattened into one line.
export function sparkline(steps, values, color, width = 120, height = 24) {
  const pts = steps.map((s, i) => [s, values[i]]).filter(([, v]) => Number.isFinite(v));
  const svg = document.createElementNS(NS, "svg");
  svg.setAttribute("class", "spark");
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.setAttribute("preserveAspectRatio", "none");
  if (pts.length < 2) return svg;
  const ys = pts.map(([, v]) => v),
    lo = Math.min(...ys),
    hi = Math.max(...ys);
  const log = lo > 0 && hi / lo > 1000,
    f = log ? Math.log10 : (v) => v;
  const x0 = pts[0][0],
    xs = pts[pts.length - 1][0] - x0 || 1,
    y0 = f(lo),
    ysp = f(hi) - y0 || 1;
  const line = document.createElementNS(NS, "polyline");
  line.setAttribute(
    "points",
    pts
      .map(
        ([s, v]) =>
          `${(((s - x0) / xs) * (width - 2) + 1).toFixed(1)},${(height - 1 - ((f(v) - y0) / ysp) * (height - 2)).toFixed(1)}`,
      )
      .join(" "),
  );
  line.setAttribute("stroke", color);
  svg.append(line);
  svg.dataset.points = pts.length;
  return svg;
}
