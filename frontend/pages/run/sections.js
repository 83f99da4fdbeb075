// The run page's sections (training, the script's metrics, gradient diagnostics, performance and
// system): each a <details> that folds, remembered across runs and visits in localStorage.

const STORE = "gradwatch.run.sections"; // {section: false} for the folded ones

function folded() {
  try {
    return JSON.parse(localStorage.getItem(STORE) || "{}");
  } catch {
    return {}; // storage off or unreadable: every section open
  }
}

function remember(name, open) {
  const state = folded();
  if (open) delete state[name];
  else state[name] = false;
  try {
    localStorage.setItem(STORE, JSON.stringify(state));
  } catch {
    /* private mode: the choice lasts for this page only */
  }
}

// Restores each section's remembered state and follows the user's; charts drawn while folded have
// no size, so they are fitted when their section opens.
export function mountSections(root = document) {
  const state = folded();
  for (const sec of root.querySelectorAll("details.run-section")) {
    const name = sec.dataset.section;
    if (state[name] === false) sec.open = false;
    sec.addEventListener("toggle", () => {
      remember(name, sec.open);
      if (sec.open) for (const c of sec.querySelectorAll(".js-plotly-plot")) Plotly.Plots.resize(c);
    });
  }
}
