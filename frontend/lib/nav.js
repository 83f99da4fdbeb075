// The navigation every page carries (Runs, Alerts inbox, Rules): the rules link names a project
// when the page shows one.

export const rulesHref = (project) => "/rules" + (project ? "?project=" + encodeURIComponent(project) : "");

// Points the page's Rules link at a project's rules.
export function navProject(project) {
  const a = document.getElementById("nav-rules");
  if (a) a.href = rulesHref(project);
}
