// Formatting shared by every page: numbers, bytes, durations, times, alert kinds as words, esc() for Plotly.

import { KIND_TITLES } from "./contract.js";

// Plotly renders <b>, <br>, <a href> ... in trace names, hover text, tick labels and titles: escape
// anything a user named (runs, metric keys, layers) before it gets there.
export const esc = (s) =>
  String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");

export const fmtTime = (t) => (t ? new Date(t * 1000).toLocaleString() : "");
export function fmtNum(v) {
  if (v === null || v === undefined) return "";
  if (typeof v === "string") return v;
  if (!isFinite(v)) return isNaN(v) ? "NaN" : v > 0 ? "+inf" : "-inf";
  return Math.abs(v) >= 1e5 || (Math.abs(v) < 1e-3 && v !== 0) ? v.toExponential(3) : String(+v.toPrecision(5));
}
export function fmtBytes(b) {
  if (b === null || b === undefined || !isFinite(b)) return "";
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (Math.abs(b) >= 1024 && i < u.length - 1) {
    b /= 1024;
    i++;
  }
  return b.toFixed(i ? 1 : 0) + " " + u[i];
}
export function fmtDuration(s) {
  if (s === null || s === undefined || !isFinite(s) || s < 0) return "";
  if (s < 60) return Math.round(s) + " s";
  if (s < 3600) return Math.floor(s / 60) + " min " + Math.round(s % 60) + " s";
  return Math.floor(s / 3600) + " h " + Math.round((s % 3600) / 60) + " min";
}

// An alert kind as words ("loss_spike" -> "Loss spike"), from the contract; a kind it does not know, spelled out.
export const kindTitle = (kind) =>
  KIND_TITLES[kind] ||
  String(kind)
    .replace(/_/g, " ")
    .replace(/^./, (c) => c.toUpperCase());

const lowerFirst = (t) => t.charAt(0).toLowerCase() + t.slice(1);

// Kinds named in a server sentence ("throughput_drop at 740") as words; other words untouched.
export const kindWords = (text) =>
  String(text).replace(/\b[a-z]+(?:_[a-z]+)+\b/g, (w) => (w in KIND_TITLES ? lowerFirst(kindTitle(w)) : w));

// "1 alert", "3 alerts".
export const plural = (n, word) => `${n} ${word}${n === 1 ? "" : "s"}`;
