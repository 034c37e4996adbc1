"""`ragrl view DIR`: one self-contained HTML file to read trajectories in a browser.

    ragrl view runs/eval              # -> runs/eval/view.html (no server, no network, no CDN)

Reads whatever the directory holds: an evaluation's `trajectories_<system>.jsonl` (+ report.json,
whose data file gives the gold passage ids), a training run's `trajectories/step_*.jsonl` and
`metrics.jsonl` (curves). Per question: the question, gold answers, each system's answer, reward
and metrics; every turn's action, with the observation marked as masked (retrieved text the policy
did not write and is not trained on); queries and retrieved passages, gold passages highlighted.
Filters (right / wrong, searched / not, format error, text), two systems side by side, curves.
The page renders one page of questions at a time, so 10k trajectories stay responsive. Its state
lives in the URL hash (`#a=agent&b=naive_rag&filter=wrong`), so a view can be linked, and tested.
"""
from __future__ import annotations

import html
import json
from pathlib import Path

from ragrl.datasets import load_questions
from ragrl.errors import RagrlError
from ragrl.jsonl import iter_json_objects

TEXT_LIMIT = 4000   # characters kept per action / observation (a page stays light)


def _read_jsonl(path: Path) -> list[dict]:
    return [row for _, row in iter_json_objects(path.read_bytes(), str(path))]


def _slim(t: dict) -> dict:
    """The fields the page shows, texts capped."""
    turns = [{"kind": x.get("kind"), "action": (x.get("action_text") or "")[:TEXT_LIMIT],
              "obs": (x.get("observation") or "")[:TEXT_LIMIT], "queries": x.get("queries") or [],
              "ids": x.get("passage_ids") or [], "error": x.get("error")} for x in t.get("turns", [])]
    m = t.get("metrics", {})
    return {"id": str(t.get("sample_id")), "q": t.get("question", ""), "golds": t.get("golds", []),
            "answer": t.get("answer"), "reward": t.get("reward", 0.0), "agent": t.get("agent", "policy"),
            "em": m.get("em"), "f1": m.get("f1"), "searches": t.get("num_searches", 0),
            "format_errors": t.get("format_errors", 0), "stop": t.get("stop_reason", ""), "turns": turns}


def collect(run_dir: str | Path) -> dict:
    """Everything the page needs from a directory: {systems: {name: [trajectory]}, gold_ids, curves}."""
    d = Path(run_dir)
    if not d.is_dir():
        raise RagrlError(f"{d}: not a directory")
    systems: dict[str, list[dict]] = {}
    for p in sorted(d.glob("trajectories_*.jsonl")):
        systems[p.stem.removeprefix("trajectories_")] = [_slim(t) for t in _read_jsonl(p)]
    for p in sorted((d / "trajectories").glob("step_*.jsonl")) if (d / "trajectories").is_dir() else []:
        systems[f"train {p.stem}"] = [_slim(t) for t in _read_jsonl(p)]
    curves = _read_jsonl(d / "metrics.jsonl") if (d / "metrics.jsonl").is_file() else []
    if not systems and not curves:
        raise RagrlError(f"{d}: no trajectories_*.jsonl, trajectories/step_*.jsonl or metrics.jsonl to show")
    gold_ids = {}
    report = d / "report.json"
    if report.is_file():
        data_file = json.loads(report.read_text()).get("settings", {}).get("data_file")
        if data_file:
            try:
                gold_ids = {str(q["id"]): q.get("gold_passage_ids") or [] for q in load_questions(data_file)}
            except RagrlError:
                gold_ids = {}   # the data file moved: the page shows no gold highlighting
    keys = [k for k in ("reward_mean", "f1", "gold_recall", "searches", "format_error_rate", "eval/recall", "eval/f1")
            if any(isinstance(r.get(k), (int, float)) for r in curves)]
    curve = {k: [[r.get("step", i), r[k]] for i, r in enumerate(curves) if isinstance(r.get(k), (int, float))]
             for k in keys}
    return {"title": str(d), "systems": systems, "gold_ids": gold_ids, "curves": curve}


def write_view(run_dir: str | Path, out: str | Path | None = None) -> Path:
    data = collect(run_dir)
    out = Path(out) if out else Path(run_dir) / "view.html"
    payload = json.dumps(data, ensure_ascii=False).replace("</", "<\\/")   # never closes the script tag
    page = PAGE.replace("__TITLE__", html.escape(data["title"])).replace("__DATA__", payload)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(page, encoding="utf-8")
    tmp.rename(out)
    return out


PAGE = r"""<!doctype html><html><head><meta charset="utf-8"><title>ragrl view: __TITLE__</title>
<style>
body{font:14px/1.4 system-ui,sans-serif;margin:0;background:#fafafa;color:#222}
header{position:sticky;top:0;background:#fff;border-bottom:1px solid #ddd;padding:8px 12px;z-index:1}
header select,header input{margin-right:8px}
main{padding:12px}.card{background:#fff;border:1px solid #ddd;border-radius:6px;margin:0 0 12px;padding:8px 12px}
.cols{display:flex;gap:12px}.col{flex:1;min-width:0}.q{font-weight:600}.gold{color:#060}
.ok{color:#060;font-weight:600}.bad{color:#a00;font-weight:600}
.act{background:#eef4ff;border-left:3px solid #36c;padding:4px 6px;margin:4px 0;white-space:pre-wrap;word-break:break-word}
.obs{background:#f0f0f0;border-left:3px dashed #999;color:#555;padding:4px 6px;margin:4px 0;white-space:pre-wrap;word-break:break-word}
.obs::before{content:"masked (retrieved, not trained on) ";font-size:11px;color:#888;display:block}
.pid{display:inline-block;border:1px solid #ccc;border-radius:3px;padding:0 3px;margin:1px;font-size:12px}
.pid.g{background:#d9f5d9;border-color:#393}.err{color:#a00}.meta{color:#666;font-size:12px}
svg{background:#fff;border:1px solid #ddd;margin:4px}#curves{display:flex;flex-wrap:wrap}
</style></head><body>
<header>
 <label>system <select id="a"></select></label>
 <label>beside <select id="b"><option value="">(none)</option></select></label>
 <label>show <select id="filter"><option value="all">all</option><option value="right">right (EM)</option>
 <option value="wrong">wrong</option><option value="searched">searched</option><option value="nosearch">did not search</option>
 <option value="format">format error</option><option value="differ">A and B differ</option></select></label>
 <input id="text" placeholder="find in question"> <span id="count" class="meta"></span>
 <button id="prev">&lt;</button><span id="page" class="meta"></span><button id="next">&gt;</button>
</header>
<main><div id="curves"></div><div id="list"></div></main>
<script id="data" type="application/json">__DATA__</script>
<script>
const D = JSON.parse(document.getElementById('data').textContent);
const PER = 50, $ = id => document.getElementById(id);
const names = Object.keys(D.systems), byId = {};
for (const n of names) { byId[n] = {}; for (const t of D.systems[n]) byId[n][t.id + '|' + t.agent] = t; }
for (const n of names) { $('a').add(new Option(n, n)); $('b').add(new Option(n, n)); }
function state() { const s = Object.fromEntries(new URLSearchParams(location.hash.slice(1)));
  return {a: s.a || names[0] || '', b: s.b || '', filter: s.filter || 'all', text: s.text || '', page: +(s.page || 0)}; }
function setState(p) { const s = Object.assign(state(), p); location.hash = new URLSearchParams(s).toString(); }
function esc(x) { return String(x ?? '').replace(/[&<>"]/g, c => ({'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;'}[c])); }
function right(t) { return t && t.em === 1; }
function keep(t, s) {
  if (s.text && !t.q.toLowerCase().includes(s.text.toLowerCase())) return false;
  const o = s.b ? byId[s.b][t.id + '|' + t.agent] : null;
  switch (s.filter) { case 'right': return right(t); case 'wrong': return !right(t);
    case 'searched': return t.searches > 0; case 'nosearch': return t.searches === 0;
    case 'format': return t.format_errors > 0; case 'differ': return !!o && (o.answer !== t.answer);
    default: return true; }
}
function side(t) {
  if (!t) return '<div class="meta">(not in this system)</div>';
  const gold = new Set(D.gold_ids[t.id] || []);
  let h = `<div>answer: <b>${esc(t.answer ?? '(none)')}</b> <span class="${right(t) ? 'ok' : 'bad'}">${right(t) ? 'right' : 'wrong'}</span>
   <span class="meta">reward ${(+t.reward).toFixed(3)} · F1 ${t.f1 == null ? '–' : (+t.f1).toFixed(2)} · searches ${t.searches} · ${esc(t.stop)}${t.agent !== 'policy' ? ' · agent ' + esc(t.agent) : ''}</span></div>`;
  for (const u of t.turns) {
    h += `<div class="act">${esc(u.action)}</div>`;
    if (u.error) h += `<div class="err">format error: ${esc(u.error)}</div>`;
    if (u.queries.length) h += `<div class="meta">queries: ${u.queries.map(esc).join(' | ')}</div>`;
    if (u.ids.length) h += '<div>' + u.ids.flat().map(p => `<span class="pid${gold.has(p) ? ' g' : ''}">${esc(p)}</span>`).join('') + '</div>';
    if (u.obs) h += `<div class="obs">${esc(u.obs)}</div>`;
  }
  return h;
}
function render() {
  const s = state(); $('a').value = s.a; $('b').value = s.b; $('filter').value = s.filter; $('text').value = s.text;
  const rows = (D.systems[s.a] || []).filter(t => keep(t, s));
  const pages = Math.max(1, Math.ceil(rows.length / PER)), page = Math.min(s.page, pages - 1);
  $('count').textContent = `${rows.length} of ${(D.systems[s.a] || []).length}`;
  $('page').textContent = ` page ${page + 1}/${pages} `;
  $('list').innerHTML = rows.slice(page * PER, (page + 1) * PER).map(t => {
    const o = s.b ? byId[s.b][t.id + '|' + t.agent] : null;
    return `<div class="card" data-id="${esc(t.id)}"><div class="q">${esc(t.q)}</div>
     <div class="gold">gold: ${t.golds.map(esc).join(' / ')}</div>
     <div class="cols"><div class="col"><div class="meta">${esc(s.a)}</div>${side(t)}</div>
     ${s.b ? `<div class="col"><div class="meta">${esc(s.b)}</div>${side(o)}</div>` : ''}</div></div>`; }).join('');
}
function curves() {
  for (const [k, pts] of Object.entries(D.curves)) {
    if (!pts.length) continue;
    const xs = pts.map(p => p[0]), ys = pts.map(p => p[1]), W = 300, H = 140;
    const x0 = Math.min(...xs), x1 = Math.max(...xs) || 1, y0 = Math.min(...ys), y1 = Math.max(...ys);
    const sx = x => 30 + (W - 40) * (x - x0) / ((x1 - x0) || 1), sy = y => H - 20 - (H - 35) * (y - y0) / ((y1 - y0) || 1);
    let ema = ys[0]; const sm = ys.map(y => (ema = 0.9 * ema + 0.1 * y));
    const line = (v, c, o) => `<polyline fill="none" stroke="${c}" stroke-opacity="${o}" points="${pts.map((p, i) => sx(p[0]) + ',' + sy(v[i])).join(' ')}"/>`;
    $('curves').insertAdjacentHTML('beforeend', `<svg width="${W}" height="${H}"><text x="30" y="12" font-size="11">${esc(k)} (raw, EMA 0.9)</text>
      <text x="2" y="${H - 20}" font-size="9">${y0.toFixed(2)}</text><text x="2" y="20" font-size="9">${y1.toFixed(2)}</text>
      ${line(ys, '#36c', 0.35)}${line(sm, '#36c', 1)}</svg>`);
  }
}
for (const id of ['a', 'b', 'filter']) $(id).onchange = e => setState({[id]: e.target.value, page: 0});
$('text').oninput = e => setState({text: e.target.value, page: 0});
$('prev').onclick = () => setState({page: Math.max(0, state().page - 1)});
$('next').onclick = () => setState({page: state().page + 1});
window.onhashchange = render; curves(); render();
</script></body></html>
"""
