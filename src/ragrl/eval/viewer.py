"""`ragrl view DIR`: one self-contained HTML file to read trajectories in a browser.

    ragrl view runs/eval              # -> runs/eval/view.html (no server, no network, no CDN)

Reads whatever the directory holds: an evaluation's `trajectories_<system>.jsonl` (+ report.json,
whose data file gives the gold passage ids), a training run's `trajectories/step_*.jsonl` and
`metrics.jsonl` (curves). Per question: the question, gold answers, each system's answer, reward
and metrics; every turn's action, with the observation marked as masked (retrieved text the policy
did not write and is not trained on); queries and retrieved passages, gold passages highlighted.
Filters (right / wrong, searched / not, format error, text), two systems side by side, or one beside
every system's answer on each question (`b=*`: what `ragrl compare` writes), curves
(axes, steps, raw and EMA; a metric constant throughout is named below them, not drawn). A
retriever's results (`retrieval_per_question.jsonl` of the quickstart or `ragrl eval --systems
retrieval`, also found from the quickstart's rl/) get their own section: ragrl.eval.retriever_view.
The page renders one page of questions at a time, so 10k trajectories stay responsive. Its state
lives in the URL hash (`#a=agent&b=naive_rag&filter=wrong`), so a view can be linked, and tested.
"""
from __future__ import annotations

import hashlib
import html
import json
import logging
import math
from pathlib import Path

from ragrl.datasets import load_questions
from ragrl.errors import RagrlError
from ragrl.eval.retriever_view import RET_BAR, RET_CSS, RET_JS, RET_MAIN, ROWS_FILE, collect_retrieval, curves_dir
from ragrl.jsonl import iter_json_file

log = logging.getLogger(__name__)

TEXT_LIMIT = 4000   # characters kept per action / observation (a page stays light)
# Trajectories per system in the page: the page renders 10,000 a page of 50 at a time (tests/eval/test_viewer);
# a 100 MB dump whole would make a page a browser struggles to open. Files are streamed, and over this
# sampled (_slim_file); benchmarks/viewer.py times a 100 MB file.
MAX_PER_SYSTEM = 10_000


def _read_jsonl(path: Path) -> list[dict]:
    return [row for _, row in iter_json_file(path)]


def _slim_file(path: Path, limit: int) -> tuple[list[dict], int]:
    """(the page's trajectories of one file, how many the file holds), read a line at a time. Over
    `limit`, a fixed sample: the trajectories of the `limit` question ids whose SHA-1 is smallest, so
    every system of one comparison shows the same questions, and the same on every run of `view`."""
    ids, rows = [], []
    for _, row in iter_json_file(path):   # one pass, keeping at most `limit` pages' rows
        ids.append(str(row.get("sample_id")))
        if len(ids) <= limit:
            rows.append(_slim(row))
    if len(ids) <= limit:
        return rows, len(ids)
    keep = set(sorted(set(ids), key=lambda i: hashlib.sha1(i.encode()).hexdigest())[:limit])
    rows = [_slim(row) for _, row in iter_json_file(path) if str(row.get("sample_id")) in keep]
    return rows[:limit], len(ids)


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


def collect(run_dir: str | Path, max_per_system: int = MAX_PER_SYSTEM) -> dict:
    """Everything the page needs from a directory: {systems: {name: [trajectory]}, gold_ids, curves,
    flat (the metrics constant throughout: {name: value}), retrieval (ragrl.eval.retriever_view),
    sampled ({system: [shown, held]} for a file over `max_per_system` trajectories: _slim_file)}."""
    d = Path(run_dir)
    if not d.is_dir():
        raise RagrlError(f"{d}: not a directory")
    systems: dict[str, list[dict]] = {}
    sampled: dict[str, list[int]] = {}   # {system: [shown, held]} where a file holds more than the page shows
    files = [(p.stem.removeprefix("trajectories_"), p) for p in sorted(d.glob("trajectories_*.jsonl"))]
    if (d / "trajectories").is_dir():
        files += [(f"train {p.stem}", p) for p in sorted((d / "trajectories").glob("step_*.jsonl"))]
    for name, p in files:
        systems[name], held = _slim_file(p, max_per_system)
        if held > len(systems[name]):
            sampled[name] = [len(systems[name]), held]
    retrieval = collect_retrieval(d)
    metrics_dir = d if (d / "metrics.jsonl").is_file() else curves_dir(d) if retrieval else None
    curves = _read_jsonl(metrics_dir / "metrics.jsonl") if metrics_dir else []
    if not systems and not curves and retrieval is None:
        raise RagrlError(f"{d}: no trajectories_*.jsonl, trajectories/step_*.jsonl, {ROWS_FILE} or metrics.jsonl to show")
    gold_ids = {}
    report = d / "report.json"
    if report.is_file():
        data_file = json.loads(report.read_text()).get("settings", {}).get("data_file")
        if data_file:
            try:
                gold_ids = {str(q["id"]): q.get("gold_passage_ids") or [] for q in load_questions(data_file)}
            except RagrlError:
                gold_ids = {}   # the data file moved: the page shows no gold highlighting
    keys = [k for k in ("reward_mean", "f1", "gold_recall", "searches", "format_error_rate", "eval/recall",
                        "eval/answer_at_k", "eval/f1") if any(isinstance(r.get(k), (int, float)) for r in curves)]
    # The guards' events (ragrl.train.guards): shown where one acted, so a rollback or a skipped
    # update is seen next to the curve it explains.
    keys += [k for k in ("guard/rollbacks", "guard/nonfinite_skipped", "timeouts")
             if any(isinstance(r.get(k), (int, float)) and r[k] for r in curves)]
    curve = {k: [[r.get("step", i), r[k]] for i, r in enumerate(curves)
                 if isinstance(r.get(k), (int, float)) and math.isfinite(r[k])] for k in keys}   # NaN: not JSON
    flat = {k: v[0][1] for k, v in curve.items() if len(v) > 1 and len({y for _, y in v}) == 1}
    curve = {k: v for k, v in curve.items() if k not in flat}
    return {"title": str(d), "systems": systems, "gold_ids": gold_ids, "curves": curve, "flat": flat,
            "retrieval": retrieval, "sampled": sampled}


def write_view(run_dir: str | Path, out: str | Path | None = None) -> Path:
    data = collect(run_dir)
    for name, (shown, held) in data["sampled"].items():
        log.info("view: %s holds %d trajectories; the page shows a fixed sample of %d questions", name, held, shown)
    out = Path(out) if out else Path(run_dir) / "view.html"
    payload = json.dumps(data, ensure_ascii=False).replace("</", "<\\/")   # never closes the script tag
    page = PAGE.replace("__RET_CSS__", RET_CSS).replace("__RET_BAR__", RET_BAR).replace("__RET_MAIN__", RET_MAIN)
    page = page.replace("__RET_JS__", RET_JS).replace("__TITLE__", html.escape(data["title"])).replace("__DATA__", payload)
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
svg{background:#fff;border:1px solid #ddd;margin:4px}#curves{display:flex;flex-wrap:wrap}[hidden]{display:none!important}
.tick{font-size:10px;fill:#555}.ctitle{font-size:12px;font-weight:600;fill:#222}.lgd{font-size:10px;fill:#333}
__RET_CSS__</style></head><body>
<header>
 <select id="view" hidden><option value="retrieval">retrieval</option><option value="traj">trajectories</option></select>
 <span id="trajbar"><label>system <select id="a"></select></label>
 <label>beside <select id="b"><option value="">(none)</option><option value="*">every system</option></select></label>
 <label>show <select id="filter"><option value="all">all</option><option value="right">right (EM)</option>
 <option value="wrong">wrong</option><option value="searched">searched</option><option value="nosearch">did not search</option>
 <option value="format">format error</option><option value="differ">A and B differ</option></select></label>
 <input id="text" placeholder="find in question"> <span id="count" class="meta"></span>
 <button id="prev">&lt;</button><span id="page" class="meta"></span><button id="next">&gt;</button></span>
__RET_BAR__
</header>
<main><div id="curves"></div><div id="flat" class="meta"></div><div id="sampled" class="meta"></div><div id="none" class="meta" hidden>No per-question
results here (trajectories_*.jsonl, trajectories/ or retrieval_per_question.jsonl): curves only. A retriever run's
results: ragrl eval --run RUN --systems retrieval --out OUT, then ragrl view OUT.</div><div id="list"></div>__RET_MAIN__</main>
<script id="data" type="application/json">__DATA__</script>
<script>
const D = JSON.parse(document.getElementById('data').textContent);
const PER = 50, $ = id => document.getElementById(id);
const names = Object.keys(D.systems), byId = {};
for (const n of names) { byId[n] = {}; for (const t of D.systems[n]) byId[n][t.id + '|' + t.agent] = t; }
for (const n of names) { $('a').add(new Option(n, n)); $('b').add(new Option(n, n)); }
function state() { const s = Object.fromEntries(new URLSearchParams(location.hash.slice(1)));
  return {a: s.a || names[0] || '', b: s.b || '', filter: s.filter || 'all', text: s.text || '', page: +(s.page || 0),
          view: s.view || ''}; }
function setState(p) {   // keeps the retrieval section's keys (rf, rs, rk, rq, rp) too
  const s = Object.assign(state(), Object.fromEntries(new URLSearchParams(location.hash.slice(1))), p);
  location.hash = new URLSearchParams(s).toString(); }
function esc(x) { return String(x ?? '').replace(/[&<>"]/g, c => ({'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;'}[c])); }
function right(t) { return t && t.em === 1; }
function keep(t, s) {
  if (s.text && !t.q.toLowerCase().includes(s.text.toLowerCase())) return false;
  const o = s.b && s.b !== '*' ? byId[s.b][t.id + '|' + t.agent] : null;
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
function every(t) {   // one line per system on this question: its answer, right or wrong, F1, searches, gold found
  const gold = new Set(D.gold_ids[t.id] || []);
  const rows = names.map(n => { const o = byId[n][t.id + '|' + t.agent];
    if (!o) return `<tr class="every"><td>${esc(n)}</td><td class="meta" colspan="4">(not in this system)</td></tr>`;
    const ids = o.turns.flatMap(u => u.ids.flat()), found = ids.filter(p => gold.has(p)).length;
    return `<tr class="every"><td>${esc(n)}</td><td><b>${esc(o.answer ?? '(none)')}</b></td>`
      + `<td class="${right(o) ? 'ok' : 'bad'}">${right(o) ? 'right' : 'wrong'}</td>`
      + `<td>F1 ${o.f1 == null ? '–' : (+o.f1).toFixed(2)}</td><td class="meta">searches ${o.searches}`
      + `${gold.size ? ` · gold ${found}/${gold.size}` : ''}</td></tr>`; }).join('');
  return `<table class="meta">${rows}</table>`; }
function render() {
  const s = state(); $('a').value = s.a; $('b').value = s.b; $('filter').value = s.filter; $('text').value = s.text;
  const rows = (D.systems[s.a] || []).filter(t => keep(t, s));
  const pages = Math.max(1, Math.ceil(rows.length / PER)), page = Math.min(s.page, pages - 1);
  $('count').textContent = `${rows.length} of ${(D.systems[s.a] || []).length}`;
  $('page').textContent = ` page ${page + 1}/${pages} `;
  $('list').innerHTML = rows.slice(page * PER, (page + 1) * PER).map(t => {
    const o = s.b && s.b !== '*' ? byId[s.b][t.id + '|' + t.agent] : null;
    const beside = s.b === '*' ? `<div class="col"><div class="meta">every system</div>${every(t)}</div>`
      : s.b ? `<div class="col"><div class="meta">${esc(s.b)}</div>${side(o)}</div>` : '';
    return `<div class="card" data-id="${esc(t.id)}"><div class="q">${esc(t.q)}</div>
     <div class="gold">gold: ${t.golds.map(esc).join(' / ')}</div>
     <div class="cols"><div class="col"><div class="meta">${esc(s.a)}</div>${side(t)}</div>
     ${beside}</div></div>`; }).join('');
}
function nice(lo, hi, n, integer) {   // axis bounds and ticks at 1, 2, 5 · 10^e
  if (!(hi > lo)) { const d = Math.abs(lo) * 0.1 || 1; lo -= d; hi += d; }
  const raw = (hi - lo) / n, mag = Math.pow(10, Math.floor(Math.log10(raw))), f = raw / mag;
  let step = (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * mag;
  if (integer) step = Math.max(1, Math.round(step));
  const a = Math.floor(lo / step) * step, b = Math.ceil(hi / step) * step, ticks = [];
  for (let v = a; v <= b + step / 2; v += step) ticks.push(+v.toPrecision(12));
  return {lo: a, hi: b, ticks, dec: Math.max(0, -Math.floor(Math.log10(step)))}; }
function curves() {   // per metric: title, axes with ticks (x: step), raw + EMA 0.9 (or points if few), legend
  for (const [k, pts] of Object.entries(D.curves)) {
    if (!pts.length) continue;
    const W = 300, H = 180, L = 46, RM = 10, T = 26, B = 34, xs = pts.map(p => p[0]), ys = pts.map(p => p[1]);
    const X = nice(Math.min(...xs), Math.max(...xs), 5, true), Y = nice(Math.min(...ys), Math.max(...ys), 4, false);
    const sx = x => (L + (W - L - RM) * (x - X.lo) / (X.hi - X.lo)).toFixed(1);
    const sy = y => (H - B - (H - T - B) * (y - Y.lo) / (Y.hi - Y.lo)).toFixed(1);
    const many = pts.length >= 12;
    let ema = ys[0]; const sm = ys.map(y => (ema = 0.9 * ema + 0.1 * y));
    const line = (v, o, w) => `<polyline fill="none" stroke="#36c" stroke-opacity="${o}" stroke-width="${w}" points="${xs.map((x, i) => sx(x) + ',' + sy(v[i])).join(' ')}"/>`;
    let g = '';
    for (const t of Y.ticks) g += `<line x1="${L}" x2="${W - RM}" y1="${sy(t)}" y2="${sy(t)}" stroke="#eee"/><text class="tick" x="${L - 4}" y="${+sy(t) + 3}" text-anchor="end">${t.toFixed(Y.dec)}</text>`;
    for (const t of X.ticks) g += `<line x1="${sx(t)}" x2="${sx(t)}" y1="${H - B}" y2="${H - B + 4}" stroke="#999"/><text class="tick" x="${sx(t)}" y="${H - B + 15}" text-anchor="middle">${t.toFixed(X.dec)}</text>`;
    g += `<line x1="${L}" y1="${T}" x2="${L}" y2="${H - B}" stroke="#999"/><line x1="${L}" y1="${H - B}" x2="${W - RM}" y2="${H - B}" stroke="#999"/>`
      + `<text class="tick" x="${(L + W - RM) / 2}" y="${H - 5}" text-anchor="middle">step</text>`;
    const lx = W - RM - 118, legend = many
      ? `<line x1="${lx}" x2="${lx + 14}" y1="10" y2="10" stroke="#36c" stroke-opacity="0.35"/><text class="lgd" x="${lx + 17}" y="13">raw</text>`
        + `<line x1="${lx + 42}" x2="${lx + 56}" y1="10" y2="10" stroke="#36c" stroke-width="1.8"/><text class="lgd" x="${lx + 59}" y="13">EMA 0.9</text>`
      : `<circle cx="${lx + 49}" cy="10" r="2.5" fill="#36c"/><text class="lgd" x="${lx + 56}" y="13">value</text>`;
    const body = many ? line(ys, 0.35, 1) + line(sm, 1, 1.8)
      : line(ys, 1, 1.2) + xs.map((x, i) => `<circle cx="${sx(x)}" cy="${sy(ys[i])}" r="2.5" fill="#36c"/>`).join('');
    $('curves').insertAdjacentHTML('beforeend', `<svg class="curve" data-metric="${esc(k)}" width="${W}" height="${H}">`
      + `<text class="ctitle" x="8" y="14">${esc(k)}</text>${legend}${g}${body}</svg>`);
  }
  const flat = Object.entries(D.flat || {});
  $('flat').textContent = flat.length ? 'constant throughout (not drawn): ' + flat.map(([k, v]) => `${k} = ${+v.toPrecision(4)}`).join(', ') : '';
}
function mode() {   // which section shows: retrieval (the default where there is one), trajectories, or none
  const v = state().view, ret = !!D.retrieval, tr = names.length > 0;
  return ret && (v !== 'traj' || !tr) ? 'retrieval' : tr ? 'traj' : 'none'; }
function show() {
  const m = mode(); $('view').value = m; $('view').hidden = !(D.retrieval && names.length);
  $('trajbar').hidden = $('list').hidden = m !== 'traj'; $('retbar').hidden = $('ret').hidden = m !== 'retrieval';
  $('none').hidden = m !== 'none';
  if (m === 'traj') render(); else if (m === 'retrieval') rRender(); }
__RET_JS__
for (const id of ['a', 'b', 'filter']) $(id).onchange = e => setState({[id]: e.target.value, page: 0});
$('text').oninput = e => setState({text: e.target.value, page: 0});
$('prev').onclick = () => setState({page: Math.max(0, state().page - 1)});
$('next').onclick = () => setState({page: state().page + 1});
$('view').onchange = e => setState({view: e.target.value});
if (D.retrieval) rInit();
$('sampled').textContent = Object.entries(D.sampled || {}).map(([k, [n, m]]) => `${k}: ${n} of its ${m} `
  + 'trajectories, a fixed sample of question ids (the same in every system)').join('; ');
window.onhashchange = show; curves(); show();
document.body.dataset.firstRenderMs = Math.round(performance.now());   // load to first page shown (tests read it)
</script></body></html>
"""
