// Fetching from the server: JSON with a readable error, and one key of one run as pages hold it.

import { num } from "./contract.js";

export async function getJSON(url, options) {
  const r = await fetch(url, options);
  if (!r.ok) {
    let msg = r.status + " " + r.statusText;
    try {
      const body = await r.json();
      msg = body.error || body.detail || msg;
    } catch {
      /* not JSON */
    }
    const err = new Error(typeof msg === "string" ? msg : JSON.stringify(msg));
    err.status = r.status; // 404 means "not there (yet)"; anything else is a failure to say so
    throw err;
  }
  return r.json();
}

// For answers that can come back out of order (a picker or slider moved twice): `const turn = turns()`
// once, then per request `const mine = turn()`, and after its await `if (!mine()) return`: true only while
// no later turn() was taken, so a late answer never replaces a newer one.
export function turns() {
  let n = 0;
  return () => {
    const ask = ++n;
    return () => ask === n;
  };
}

// One key of one run, as the pages hold it: {steps, values (numbers), walls}.
export async function fetchSeries(runId, key, query = "max_points=4000") {
  const s = await getJSON(`/api/runs/${runId}/series?key=${encodeURIComponent(key)}&${query}`);
  return { steps: s.steps, values: s.values.map(num), walls: s.wall_times };
}
