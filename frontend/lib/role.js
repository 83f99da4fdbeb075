// What this page's token may do (GET /api/me): its abilities go on <body data-can="read edit ...">, and
// style.css hides every control marked data-needs="edit" or "admin" that the role lacks (a viewer sees no
// Delete button, an editor no rule or channel editing). The server refuses those anyway (403).
fetch("/api/me", { headers: { Accept: "application/json" } })
  .then((r) => (r.ok ? r.json() : null))
  .then((me) => {
    if (!me) return;
    document.body.dataset.can = me.can.join(" ");
    document.body.dataset.role = me.role;
    document.body.title = `logged in as ${me.name} (${me.role})`;
  })
  .catch(() => {});
