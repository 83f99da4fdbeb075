// Formatting shared by every page: numbers, bytes, durations, times, alert kinds as words, esc() for Plotly.

import { formatNumber, KIND_TITLES } from "./contract.js";

// Plotly renders <b>, <br>, <a href> ... in trace names, hover text, tick labels and titles: escape
// anything a user named (runs, metric keys, layers) before it gets there.
export const esc = (s) =>
  String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");

export const fmtTime = (t) => (t ? new Date(t * 1000).toLocaleString() : "");
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

// The one number format of every page, the CLI and the report (gradwatch.contract.format): 1e-4, 0.01, 1,
// 32, +inf (also for the contract's "Infinity" strings). Sweep values, summaries and group labels use it.
export const fmtNumber = formatNumber;

// A start time short enough for a table column: the time today, the day and time this year, else the date
// (the full time goes in the cell's title). The formatters are made once: making one per call costs more
// than a windowed table's whole row.
const HM = new Intl.DateTimeFormat([], { hour: "2-digit", minute: "2-digit" });
const DAY_HM = new Intl.DateTimeFormat([], { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit" });
const DATE = new Intl.DateTimeFormat([]);
export function fmtShortTime(t, now = new Date()) {
  if (!t) return "";
  const d = new Date(t * 1000);
  if (d.toDateString() === now.toDateString()) return HM.format(d);
  return (d.getFullYear() === now.getFullYear() ? DAY_HM : DATE).format(d);
}
