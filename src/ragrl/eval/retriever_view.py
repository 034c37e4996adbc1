"""The retriever's part of `ragrl view`: per question, what each retriever put in its top k.

The quickstart's held-out comparison and `ragrl eval --systems retrieval` write what they already
computed to `retrieval_per_question.jsonl` (no second search), one row per question:

    {"id": "2hop__82713_84616", "set": "musique_dev", "kind": "2hop", "question": "...",
     "answers": ["..."], "gold_ids": ["p014788", "p014799"],
     "systems": {"base encoder": {"recall": 0.5, "answer_at_k": 1.0,
                                  "hops": [[{"id": "p014788", "title": "...", "text": "first 40 words",
                                             "gold": true, "answer": false}, ...], [...]]},
                 "RL encoder": {...}}}

The first system is the baseline. `recall` (gold recall@k) is null without gold ids; `answer_at_k`
and every passage's `answer` are null for yes/no questions (as in `retrieval_eval`); a passage's
`answer` is the test answer@k uses (`answer_in` on "title. text"). `hops` holds the ranked passages
of each hop (one list for a single-hop search).

`ragrl view` (ragrl.eval.viewer) turns these rows into the page's retrieval section: base and trained
top k side by side, gold (★) and answer-bearing (✓) passages marked, filters (answer@k / recall
gained, lost, unchanged; set; kind; text), a per-kind summary table, 50 questions a page.
"""
from __future__ import annotations

import json
from pathlib import Path

from ragrl.eval.retrieval import answer_in, is_yes_no, question_kind
from ragrl.jsonl import iter_json_objects

ROWS_FILE = "retrieval_per_question.jsonl"
SNIPPET_WORDS = 40


def snippet(text: str, words: int = SNIPPET_WORDS) -> str:
    """The first `words` words of `text` (… where cut).

    >>> snippet("a b c d", 2)
    'a b …'
    """
    parts = (text or "").split()
    return " ".join(parts[:words]) + (" …" if len(parts) > words else "")


def set_name(data: str) -> str:
    """A question file's short name, e.g. for a row's `set`.

    >>> set_name("kit:eval/musique_dev.jsonl.gz"), set_name("demo-eval")
    ('musique_dev', 'demo-eval')
    """
    name = Path(str(data).split(":", 1)[-1]).name
    for ext in (".gz", ".jsonl", ".json"):
        name = name.removesuffix(ext)
    return name


def retrieval_rows(samples: list[dict], hits: dict[str, dict], per_question: dict[str, dict], *,
                   set_name: str, hop_size: int | None = None) -> list[dict]:
    """The rows of `retrieval_per_question.jsonl` for `samples` (their order), from what
    `compare_retrievers` computed: hits {system: {id: [Hit]}} (its hits_out) and per_question
    {system: {id: row}} (its systems' "per_question"); the first system is the baseline."""
    out = []
    for q in samples:
        qid, answers = str(q["id"]), list(q.get("answers") or [])
        golds, yes_no = set(q.get("gold_passage_ids") or []), is_yes_no(answers)
        systems = {}
        for name, by_id in hits.items():
            if qid not in by_id:
                continue
            metrics = per_question.get(name, {}).get(qid, {})
            passages = [{"id": h.id, "title": h.title, "text": snippet(h.text), "gold": h.id in golds,
                         "answer": None if yes_no else bool(answer_in([f"{h.title}. {h.text}"], answers))}
                        for h in by_id[qid]]
            size = hop_size or max(len(passages), 1)
            systems[name] = {"recall": metrics.get("recall"), "answer_at_k": metrics.get("answer_at_k"),
                             "hops": [passages[i:i + size] for i in range(0, len(passages), size)] or [[]]}
        out.append({"id": qid, "set": set_name, "kind": question_kind(q), "question": q.get("question", ""),
                    "answers": answers, "gold_ids": list(q.get("gold_passage_ids") or []), "systems": systems})
    return out


def write_retrieval_rows(path: str | Path, rows: list[dict]) -> Path:
    """`rows` as JSONL (written whole, then renamed into place)."""
    path = Path(path)
    tmp = path.with_suffix(".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False, allow_nan=False) + "\n")
    tmp.rename(path)
    return path


def rows_file(d: Path) -> Path | None:
    """The directory's per-question retrieval file; for a training run inside a quickstart folder
    (runs/quickstart/rl), the one beside it."""
    for p in (d / ROWS_FILE, d.parent / ROWS_FILE):
        if p.is_file() and (p.parent == d or (d / "config.yaml").is_file()):
            return p
    return None


def curves_dir(d: Path) -> Path | None:
    """Where the training curves of a retrieval results folder are: the quickstart's rl/, or the
    run an evaluation's retrieval.json names."""
    if (d / "rl" / "metrics.jsonl").is_file():
        return d / "rl"
    try:
        run = json.loads((d / "retrieval.json").read_text()).get("settings", {}).get("run")
    except (OSError, ValueError):
        return None
    return Path(run) if run and (Path(run) / "metrics.jsonl").is_file() else None


def collect_retrieval(d: Path) -> dict | None:
    """The page's retrieval data from the directory's rows (None without them): passages once each
    ({id: [title, text]}), and per question its fields, the answer-bearing passage ids and, per
    system (in `systems` order, null where a system lacks the question), recall, answer@k and the
    passage ids of each hop."""
    path = rows_file(d)
    if path is None:
        return None
    rows = [row for _, row in iter_json_objects(path.read_bytes(), str(path))]
    systems: list[str] = []
    for row in rows:
        systems += [s for s in row.get("systems", {}) if s not in systems]
    passages: dict[str, list[str]] = {}
    out = []
    for row in rows:
        answer_ids, per_system = set(), []
        for name in systems:
            s = row.get("systems", {}).get(name)
            if s is None:
                per_system.append(None)
                continue
            for hop in s.get("hops", []):
                for p in hop:
                    passages.setdefault(p["id"], [p.get("title", ""), p.get("text", "")])
                    if p.get("answer"):
                        answer_ids.add(p["id"])
            per_system.append({"r": s.get("recall"), "a": s.get("answer_at_k"),
                               "h": [[p["id"] for p in hop] for hop in s.get("hops", [])]})
        out.append({"id": str(row.get("id")), "q": row.get("question", ""), "ans": row.get("answers", []),
                    "set": row.get("set", ""), "kind": row.get("kind", ""), "gold": row.get("gold_ids", []),
                    "aok": sorted(answer_ids), "s": per_system})
    return {"file": str(path), "systems": systems, "passages": passages, "rows": out}


RET_CSS = r"""
.psg{border:1px solid #ddd;border-left:4px solid #ddd;border-radius:3px;padding:2px 6px;margin:3px 0;font-size:13px}
.psg.g{background:#e3f6e3;border-color:#4a4}.psg.a{border-left-color:#e08a00}.psg.g.a{border-left-color:#e08a00}
.mk{display:inline-block;min-width:2.2em;font-weight:700}.mk .st{color:#1a7f1a}.mk .ck{color:#c06a00}
.rank{color:#888;font-size:11px;margin-right:4px}.pidt{color:#888;font-size:11px}.snip{color:#444;font-size:12px}
.new{font-size:10px;color:#36c;border:1px solid #36c;border-radius:3px;padding:0 2px;margin-left:4px}
.hop{font-size:11px;color:#666;text-transform:uppercase;margin-top:6px}
.up{color:#060;font-weight:600}.down{color:#a00;font-weight:600}
table.kinds{border-collapse:collapse;background:#fff;margin:0 0 12px;font-size:13px}
.kinds td,.kinds th{border:1px solid #ddd;padding:2px 8px;text-align:right}.kinds td:nth-child(-n+2),.kinds th:nth-child(-n+2){text-align:left}
.kinds tbody tr{cursor:pointer}.kinds tbody tr:hover{background:#f3f7ff}.kinds tr.total{font-weight:600}
.legend{margin:0 0 8px}
"""

RET_BAR = r"""<span id="retbar" hidden>
 <label>show <select id="rf"><option value="all">all</option>
 <option value="answer-gained">answer@k gained</option><option value="answer-lost">answer@k lost</option>
 <option value="answer-same">answer@k unchanged</option><option value="recall-gained">gold recall gained</option>
 <option value="recall-lost">gold recall lost</option><option value="recall-same">gold recall unchanged</option>
 <option value="differ">top k differs</option></select></label>
 <label>set <select id="rs"><option value="">all</option></select></label>
 <label>kind <select id="rk"><option value="">all</option></select></label>
 <input id="rq" placeholder="find in question, answer, titles"> <span id="rcount" class="meta"></span>
 <button id="rprev">&lt;</button><span id="rpage" class="meta"></span><button id="rnext">&gt;</button>
</span>"""

RET_MAIN = r"""<div id="ret" hidden><div class="legend meta"><span class="psg g a" style="display:inline-block">
<span class="mk"><span class="st">★</span><span class="ck">✓</span></span>passage</span> ★ green: a gold passage ·
✓ orange edge: holds a gold answer (the answer@k test) · <span class="new">new</span> not in the baseline's top k</div>
<div id="rinfo" class="meta"></div><table class="kinds" id="kinds"></table><div id="rlist"></div></div>"""

RET_JS = r"""
const R = D.retrieval, PS = R ? R.passages : {}, RSYS = R ? R.systems : [];
function rState() { const s = Object.fromEntries(new URLSearchParams(location.hash.slice(1)));
  return {rf: s.rf || 'all', rs: s.rs || '', rk: s.rk || '', rq: s.rq || '', rp: +(s.rp || 0)}; }
function pct(x) { return x == null ? '–' : (100 * x).toFixed(1); }
function change(r, key) {   // +1 gained, -1 lost, 0 unchanged, null: not comparable
  const b = r.s[0], t = r.s[1]; if (!b || !t) return null;
  const x = key === 'answer' ? b.a : b.r, y = key === 'answer' ? t.a : t.r;
  return x == null || y == null ? null : Math.sign(y - x); }
function rKeep(r, s) {
  if (s.rs && r.set !== s.rs) return false;
  if (s.rk && r.kind !== s.rk) return false;
  if (s.rq && !r.hay.includes(s.rq.toLowerCase())) return false;
  if (s.rf === 'all') return true;
  if (s.rf === 'differ') return !!r.s[1] && !!r.s[0] && r.s[1].h.flat().join() !== r.s[0].h.flat().join();
  const [key, how] = s.rf.split('-'), c = change(r, key);
  return c !== null && c === {gained: 1, lost: -1, same: 0}[how]; }
function rSide(r, i) {
  const x = r.s[i], name = RSYS[i];
  if (!x) return `<div class="col rsys"><div class="meta">${esc(name)}</div><div class="meta">(not in this system)</div></div>`;
  const gold = new Set(r.gold), ans = new Set(r.aok), base = new Set(i > 0 && r.s[0] ? r.s[0].h.flat() : []);
  const k = x.h.flat().length, c = i > 0 ? change(r, 'answer') : null;
  let h = `<div class="col rsys" data-sys="${esc(name)}"><div class="meta">${esc(name)}</div>
    <div>answer@${k} <b class="${x.a ? 'ok' : 'bad'}">${x.a == null ? '–' : x.a ? '✓ yes' : '✗ no'}</b>${c ? ` <span class="${c > 0 ? 'up' : 'down'}">(${c > 0 ? 'gained' : 'lost'})</span>` : ''}
    · gold recall@${k} <b>${x.r == null ? '–' : pct(x.r) + '%'}</b></div>`;
  x.h.forEach((hop, j) => {
    if (x.h.length > 1) h += `<div class="hop">hop ${j + 1}</div>`;
    hop.forEach((p, n) => { const g = gold.has(p), a = ans.has(p), t = PS[p] || ['', ''];
      h += `<div class="psg${g ? ' g' : ''}${a ? ' a' : ''}" data-pid="${esc(p)}"><span class="mk">${g ? '<span class="st">★</span>' : ''}${a ? '<span class="ck">✓</span>' : ''}</span>`
        + `<span class="rank">${n + 1}.</span><b>${esc(t[0])}</b> <span class="pidt">${esc(p)}</span>${i > 0 && !base.has(p) ? '<span class="new">new</span>' : ''}`
        + `<div class="snip">${esc(t[1])}</div></div>`; }); });
  return h + '</div>'; }
function signed(n, sign) { return n ? sign + n : '0'; }
function kindTable() {
  const groups = {}, two = RSYS.length > 1;
  for (const r of R.rows) for (const key of [r.set + '\u0000' + r.kind, '\u0000']) {
    const g = groups[key] = groups[key] || {n: 0, a: [], r: []}; g.n++;
    for (const [m, f] of [['a', 'answer'], ['r', 'recall']]) {
      const b = r.s[0] ? r.s[0][m] : null, t = two && r.s[1] ? r.s[1][m] : null;
      if (b != null && (!two || t != null)) g[m].push([b, t]); } }
  const cell = v => { if (!v.length) return '<td>–</td><td>–</td><td>–</td>';
    const mb = v.reduce((s, p) => s + p[0], 0) / v.length, mt = two ? v.reduce((s, p) => s + p[1], 0) / v.length : null;
    return `<td>${pct(mb)}${two ? ' → ' + pct(mt) : ''} <span class="meta">(n=${v.length})</span></td>`
      + `<td class="up">${two ? signed(v.filter(p => p[1] > p[0]).length, '+') : '–'}</td>`
      + `<td class="down">${two ? signed(v.filter(p => p[1] < p[0]).length, '−') : '–'}</td>`; };
  const k = R.rows.length ? Math.max(...R.rows.slice(0, 200).map(r => r.s[0] ? r.s[0].h.flat().length : 0)) : 0;
  let h = `<thead><tr><th>set</th><th>kind</th><th>n</th><th>answer@${k} ${esc(RSYS[0] || '')}${two ? ' → ' + esc(RSYS[1]) : ''}</th><th>gained</th><th>lost</th>`
    + `<th>gold recall@${k}</th><th>gained</th><th>lost</th></tr></thead><tbody>`;
  for (const key of Object.keys(groups).sort()) { const [set, kind] = key.split('\u0000'), g = groups[key];
    h += `<tr class="${set ? '' : 'total'}" data-set="${esc(set)}" data-kind="${esc(kind)}"><td>${set ? esc(set) : 'all'}</td><td>${set ? esc(kind) : 'all'}</td><td>${g.n}</td>${cell(g.a)}${cell(g.r)}</tr>`; }
  $('kinds').innerHTML = h + '</tbody>';
  const hops = Math.max(1, ...R.rows.slice(0, 200).map(r => r.s[0] ? r.s[0].h.length : 1));
  $('rinfo').textContent = `${R.rows.length} questions · top ${k}${hops > 1 ? ` (${hops} hops of ${k / hops})` : ''} · `
    + (two ? `${RSYS[0]} (baseline) vs ${RSYS[1]}` : RSYS[0] || '') + ` · from ${R.file}`;
  $('kinds').onclick = e => { const tr = e.target.closest('tr[data-kind]'); if (tr) setState({rs: tr.dataset.set, rk: tr.dataset.kind, rp: 0}); }; }
function rRender() {
  const s = rState(); for (const id of ['rf', 'rs', 'rk', 'rq']) $(id).value = s[id];
  const rows = R.rows.filter(r => rKeep(r, s)), PERR = 50;
  const pages = Math.max(1, Math.ceil(rows.length / PERR)), page = Math.min(s.rp, pages - 1);
  $('rcount').textContent = `${rows.length} of ${R.rows.length} questions`;
  $('rpage').textContent = ` page ${page + 1}/${pages} `;
  $('rlist').innerHTML = rows.slice(page * PERR, (page + 1) * PERR).map(r => `<div class="card rcard" data-id="${esc(r.id)}">
    <div class="q">${esc(r.q)}</div><div class="meta">${esc(r.set)} · ${esc(r.kind)} · ${esc(r.id)}</div>
    <div class="gold">answer: ${r.ans.map(esc).join(' / ')} · gold passages: ${r.gold.length ? r.gold.map(esc).join(', ') : '(none)'}</div>
    <div class="cols">${RSYS.map((_, i) => rSide(r, i)).join('')}</div></div>`).join(''); }
function rInit() {
  for (const r of R.rows) {   // what the text box searches: question, id, answers, passage titles
    const pids = [...new Set(r.s.flatMap(x => x ? x.h.flat() : []))];
    r.hay = [r.q, r.id, ...r.ans, ...pids.map(p => (PS[p] || [''])[0])].join('\n').toLowerCase(); }
  for (const v of [...new Set(R.rows.map(r => r.set))].sort()) $('rs').add(new Option(v, v));
  for (const v of [...new Set(R.rows.map(r => r.kind))].sort()) $('rk').add(new Option(v, v));
  if (RSYS.length < 2) for (const o of [...$('rf').options]) o.disabled = o.value !== 'all';
  for (const id of ['rf', 'rs', 'rk']) $(id).onchange = e => setState({[id]: e.target.value, rp: 0});
  $('rq').oninput = e => setState({rq: e.target.value, rp: 0});
  $('rprev').onclick = () => setState({rp: Math.max(0, rState().rp - 1)});
  $('rnext').onclick = () => setState({rp: rState().rp + 1});
  kindTable(); }
"""
