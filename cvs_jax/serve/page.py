"""``GET /``: drop or pick a photo, see its hits as thumbnails, labelled as ``search --html`` labels them.

A line says what the session learning from the adds is doing (``serve/sessions.py``'s summary,
refreshed from ``/sessions/current`` every 5 s).  The page posts the photo to ``/search?html=1``; the
server answers with the hits' rows rendered by ``reports/search_page.py`` (the same cells as
``search --html``, thumbnails from ``/thumb/<id>.png``).
"""

from __future__ import annotations

from cvs_jax.reports import html, search_page

_FORM = """
<style>
#drop {{ border: 2px dashed #888; border-radius: 8px; padding: 18px; margin: 10px 0; text-align: center; }}
#drop.over {{ background: #eef6ff; border-color: #36c; }}
#status {{ margin: 8px 0; color: #555; }}
</style>
<p>Model of session <b id="session">{session}</b>, gallery <b id="rows">{rows}</b> rows.
{report}</p>
<p id="learning">{learning}</p>
<div id="drop">Drop a photo here, or <input type="file" id="file" name="file" accept="image/*">
 &nbsp; top <input type="number" id="k" value="{k}" min="1" max="{max_k}" style="width:4em"> hits</div>
<div id="status"></div>
{legend}
<div id="results"></div>
<script>
const drop = document.getElementById("drop"), file = document.getElementById("file");
const status = document.getElementById("status"), results = document.getElementById("results");
async function send(f) {{
  const body = new FormData();
  body.append("file", f, f.name);
  status.textContent = "searching with " + f.name + " ...";
  const k = document.getElementById("k").value;
  try {{
    const r = await fetch("search?html=1&k=" + encodeURIComponent(k), {{method: "POST", body}});
    const data = await r.json();
    if (!r.ok) {{ status.textContent = "error: " + data.error; return; }}
    document.getElementById("session").textContent = data.model_session;
    document.getElementById("rows").textContent = data.gallery_rows;
    status.textContent = "answered by the model of session " + data.model_session;
    results.innerHTML = data.html;
  }} catch (e) {{ status.textContent = "error: " + e; }}
}}
file.addEventListener("change", () => {{ if (file.files.length) send(file.files[0]); }});
drop.addEventListener("dragover", (e) => {{ e.preventDefault(); drop.classList.add("over"); }});
drop.addEventListener("dragleave", () => drop.classList.remove("over"));
async function learning() {{
  try {{
    const r = await fetch("sessions/current");
    if (r.ok) document.getElementById("learning").textContent = (await r.json()).summary;
  }} catch (e) {{}}
}}
setInterval(learning, 5000);
drop.addEventListener("drop", (e) => {{
  e.preventDefault(); drop.classList.remove("over");
  if (e.dataTransfer.files.length) send(e.dataTransfer.files[0]);
}});
</script>
"""


def render(
    *, workdir: str, model_session: int, gallery_rows: int, k: int, max_k: int, has_report: bool, session: dict
) -> str:
    """``session``: ``GET /sessions/current``'s answer, whose ``summary`` the page shows (and refreshes)."""
    report = '<a href="report.html">The run\'s report</a>.' if has_report else ""
    body = _FORM.format(
        session=model_session,
        rows=gallery_rows,
        k=k,
        max_k=max_k,
        report=report,
        legend=search_page.LEGEND,
        learning=html.esc(session["summary"]),
    )
    return html.page("visual search", workdir, body)


def hits_html(queries: list[dict]) -> str:
    """The rows of ``search --html`` for the answered queries, thumbnails by row id (a row number is a
    position, which a switch moves)."""
    return "\n".join(search_page.query_row(q, lambda hit: f"thumb/{hit['id']}.png") for q in queries)
