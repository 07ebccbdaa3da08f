"""The run browser's pages as HTML strings: run, phase, step, episode, RSR funnel, evaluation.

Self-contained: one inline style sheet, a few lines of inline JavaScript (sorting and filtering tables), inline
SVG for curves and bars; nothing is fetched from elsewhere, so the pages work offline.
"""

from __future__ import annotations

import collections
import html
import math
import urllib.parse

from rsi_jax.view.data import RunFolder, eval_file, step_file

# the run page's curves: metric in metrics.jsonl -> title
CURVES = {
    "reward_mean": "reward",
    "success_mean": "success",
    "value/explained_variance": "explained variance",
    "policy/clip_frac": "clip fraction",
    "policy/approx_kl": "KL (k3 estimate)",
    "mismatch/abs_mean": "train-inference |log-prob gap|",
    "turns_mean": "turns per episode",
    "nll_per_token": "SFT NLL per token",
}

STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:0 24px 40px;color:#222}
nav{padding:10px 0;border-bottom:1px solid #ddd;margin-bottom:12px} nav a{margin-right:12px}
table{border-collapse:collapse;margin:8px 0} td,th{border:1px solid #ddd;padding:3px 8px;text-align:left;
vertical-align:top} th{background:#f4f4f4} th.sortable{cursor:pointer} .num{text-align:right}
pre{white-space:pre-wrap;word-break:break-word;background:#f7f7f7;padding:6px;margin:4px 0;max-height:420px;
overflow:auto} pre.reply{max-height:160px} .ok{color:#080} .bad{color:#b00} .muted{color:#777} .turn{border:1px solid #ddd;margin:10px 0;
padding:8px} .curves{display:flex;flex-wrap:wrap;gap:12px} .curve{border:1px solid #eee;padding:4px}
.filters input,.filters select{margin-right:10px} .side{display:flex;flex-wrap:wrap;gap:24px;align-items:flex-start}
.side h2{margin-top:0} #info td{padding:2px 8px;font-size:13px} .lbl{display:inline-block;width:80px}
"""

SCRIPT = """
function sortTable(th){const t=th.closest('table'),i=[...th.parentNode.children].indexOf(th);
const b=t.tBodies[0],rows=[...b.rows],dir=th.dataset.dir==='asc'?-1:1;th.dataset.dir=dir===1?'asc':'desc';
const key=c=>{const s=c.querySelector('[data-sort]');return s?s.dataset.sort:c.textContent};
rows.sort((x,y)=>{const a=key(x.cells[i]),c=key(y.cells[i]);
const na=parseFloat(a),nc=parseFloat(c);return (isNaN(na)||isNaN(nc)?a.localeCompare(c):na-nc)*dir});
rows.forEach(r=>b.appendChild(r));}
function filterTable(id){const t=document.getElementById(id),f={};
document.querySelectorAll('[data-filter]').forEach(e=>{f[e.dataset.filter]=e.value});
let n=0;[...t.tBodies[0].rows].forEach(r=>{let show=true;
for(const k in f){const v=f[k];if(v===''||v===undefined)continue;const d=r.dataset[k]??'';
if(k==='task'){if(!d.toLowerCase().includes(v.toLowerCase()))show=false}
else if(k==='minturns'){if(parseInt(r.dataset.turns)<parseInt(v))show=false}
else if(d!==v)show=false}
r.style.display=show?'':'none';if(show)n++});document.getElementById(id+'-count').textContent=n;}
"""

e = html.escape


def q(**kw) -> str:
  return urllib.parse.urlencode({k: v for k, v in kw.items() if v is not None})


def page(title: str, body: str) -> str:
  return (f"<!doctype html><html><head><meta charset='utf-8'><title>{e(title)}</title><style>{STYLE}</style>"
          f"<script>{SCRIPT}</script></head><body><nav><a href='/'>run</a><a href='/eval'>evaluations</a></nav>"
          f"<h1>{e(title)}</h1>{body}</body></html>")


def _fmt(v, nd=4) -> str:
  if v is None:
    return "<span class='muted'>–</span>"
  if isinstance(v, bool):
    return "yes" if v else "no"
  if isinstance(v, float):
    return f"{v:.{nd}g}"
  return e(str(v))


def _success(v) -> str:
  if v is None:
    return "<span class='muted'>n/a</span>"
  return "<span class='ok'>pass</span>" if v == 1 else "<span class='bad'>fail</span>"


def table(head: list[str] | None, rows: list[list[str]], attrs: str = "", sortable: bool = False,
          row_attrs: list[str] | None = None) -> str:
  if head is None:
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table {attrs}><tbody>{body}</tbody></table>"
  th = "".join(f"<th class='sortable' onclick='sortTable(this)'>{h}</th>" if sortable else f"<th>{h}</th>"
               for h in head)
  body = "".join(f"<tr {row_attrs[i] if row_attrs else ''}>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>"
                 for i, r in enumerate(rows))
  return f"<table {attrs}><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


# -------------------------------------------------------------------------------------------------- svg


def curve_svg(title: str, series: dict[str, list[tuple[float, float]]], w: int = 320, h: int = 160) -> str:
  """Lines of (x, y) points per phase in one small chart, with the y range written on it."""
  pts = [(x, y) for s in series.values() for x, y in s]
  if not pts:
    return ""
  xs, ys = [p[0] for p in pts], [p[1] for p in pts]
  x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
  if x1 == x0:
    x1 = x0 + 1
  if y1 == y0:
    y0, y1 = y0 - 0.5, y1 + 0.5
  pad = 24
  sx = lambda x: pad + (x - x0) / (x1 - x0) * (w - 2 * pad)  # noqa: E731
  sy = lambda y: h - pad - (y - y0) / (y1 - y0) * (h - 2 * pad)  # noqa: E731
  colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]
  lines = []
  for i, (name, s) in enumerate(series.items()):
    c = colors[i % len(colors)]
    poly = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in s)
    lines.append(f"<polyline fill='none' stroke='{c}' stroke-width='1.5' points='{poly}'><title>{e(name)}"
                 f"</title></polyline>")
    lines += [f"<circle cx='{sx(x):.1f}' cy='{sy(y):.1f}' r='2' fill='{c}' data-phase='{e(name)}' data-x='{x}' "
              f"data-y='{y!r}'><title>{e(name)} {x}: {y:.4g}</title></circle>" for x, y in s]
  legend = " ".join(f"<tspan fill='{colors[i % len(colors)]}'>{e(n)}</tspan>" for i, n in enumerate(series))
  return (f"<svg class='curve' width='{w}' height='{h}' data-metric='{e(title)}'>"
          f"<text x='4' y='12' font-size='11'>{e(title)}: {legend}</text>"
          f"<text x='2' y='{pad + 4}' font-size='9'>{y1:.3g}</text>"
          f"<text x='2' y='{h - pad}' font-size='9'>{y0:.3g}</text>"
          f"<line x1='{pad}' y1='{h - pad}' x2='{w - pad}' y2='{h - pad}' stroke='#ccc'/>{''.join(lines)}</svg>")


def bar_svg(kind: str, turn: int, v: float | None, scale: float, w: int = 220, h: int = 16) -> str:
  """One horizontal bar from the middle: right for positive, left for negative; ``scale`` is |v| at full width.
  ``data-value`` holds the recorded number as written."""
  if v is None:
    return "<span class='muted'>–</span>"
  mid = w / 2
  frac = 0.0 if scale <= 0 else min(1.0, abs(v) / scale)
  bw = frac * (mid - 2)
  x = mid if v >= 0 else mid - bw
  color = "#1f77b4" if kind == "value" else ("#2ca02c" if v >= 0 else "#d62728")
  return (f"<svg class='bar' width='{w}' height='{h}' data-kind='{kind}' data-turn='{turn}' data-value='{v!r}'>"
          f"<rect x='0' y='0' width='{w}' height='{h}' fill='#f4f4f4'/>"
          f"<rect x='{x:.2f}' y='2' width='{bw:.2f}' height='{h - 4}' fill='{color}'/>"
          f"<line x1='{mid}' y1='0' x2='{mid}' y2='{h}' stroke='#999'/></svg> {v:+.4g}")


# ------------------------------------------------------------------------------------------------ pages


def run_page(run: RunFolder) -> str:
  plan = run.plan()
  rows = []
  for p in plan:
    en = p["entry"]
    sf = en.get("started_from") or {}
    files = run.transcript_files(p["phase"])
    link = f"<a class='phase-link' href='/phase?{q(phase=p['phase'])}'>{e(p['phase'])}</a>"
    state = "done" if p["done"] else ("running" if files or (run.root / "phases" / p["phase"]).exists()
                                      else "not started")
    rows.append([link, e(p["kind"]), state,
                 _fmt(en.get("steps")), e(str(sf.get("actor", ""))), e(str(sf.get("critic", ""))),
                 e(str(en.get("output", ""))), f"<code>{e(str(en.get('actor_digest') or ''))}</code>",
                 f"<code>{e(str(en.get('critic_digest') or ''))}</code>", _fmt(en.get("seconds"))])
  body = "<h2>Phase plan and weight lineage</h2>" + table(
      ["phase", "kind", "state", "steps", "actor from", "critic from", "output", "actor digest", "critic digest",
       "seconds"], rows, "id='plan'")
  metrics = run.metrics()
  charts = []
  for key, title in CURVES.items():
    series: dict[str, list] = {}
    for r in metrics:
      v = r.get(key)
      if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
        series.setdefault(r["phase"], []).append((r["global_step"], float(v)))
    svg = curve_svg(title, series)
    if svg:
      charts.append(svg)
  body += "<h2>Metrics per phase</h2>" + (f"<div class='curves'>{''.join(charts)}</div>" if charts
                                          else "<p class='muted'>no step recorded yet</p>")
  body += "<h2>Evaluation Mean@R per stage</h2>" + eval_table(run)
  return page(f"run {run.root.name}", body)


def eval_table(run: RunFolder) -> str:
  rows = []
  for ph, st in run.eval_runs():
    s = run.eval_summary(ph, st)
    if not s:
      continue
    rows.append([f"<a href='/evaluation?{q(phase=ph, step=st)}'>{e(ph)} step {e(st)}</a>", _fmt(s.get("mean_at_r")),
                 _fmt(s.get("pass_at_r")), _fmt(s.get("mean_at_r_with_infra_as_failure")),
                 _fmt(s.get("repeats")), _fmt(s.get("tasks")), _fmt(s.get("infra_failures"))])
  if not rows:
    return "<p class='muted'>no evaluation yet</p>"
  return table(["evaluation", "Mean@R %", "pass@R %", "Mean@R, infra as failures %", "R", "tasks", "infra"], rows,
               "id='evals'")


def phase_page(run: RunFolder, phase: str) -> str:
  files = run.transcript_files(phase)
  steps = [f for f in files if f.isdigit()]
  stages = [f for f in files if not f.isdigit()]
  body = ""
  if stages or run.manifest(phase):
    body += f"<p><a href='/rsr?{q(phase=phase)}'>RSR funnel per task</a></p>"
  by_step = {r["step"]: r for r in run.metrics() if r.get("phase") == phase}
  rows = []
  for s in steps:
    m = by_step.get(int(s), {})
    rows.append([f"<a class='step-link' href='/step?{q(phase=phase, step=s)}'>step {e(s)}</a>", _fmt(m.get("reward_mean")),
                 _fmt(m.get("success_mean")), _fmt(m.get("turns_mean")), _fmt(m.get("value/explained_variance")),
                 _fmt(m.get("infra_failures"))])
  if rows:
    body += "<h2>Rollout steps</h2>" + table(["step", "reward", "success", "turns", "explained variance",
                                               "infra failures"], rows, "id='steps'")
  for st in stages:
    body += f"<p><a href='/step?{q(phase=phase, stage=st)}'>{e(st)} episodes</a></p>"
  if not body:
    body = "<p class='muted'>no transcripts in this phase (yet)</p>"
  return page(f"phase {phase}", body)


def episodes_table(src: str, recs: list[dict], tid: str = "episodes") -> str:
  fams = sorted({r.get("family", "") for r in recs})
  kinds = sorted({r.get("failure_kind") or "" for r in recs})
  sel = lambda name, vals, labels=None: (  # noqa: E731
      f"<label>{name} <select data-filter='{name}' onchange=\"filterTable('{tid}')\"><option value=''>any</option>"
      + "".join(f"<option value='{e(v)}'>{e((labels or {}).get(v, v) or '(none)')}</option>" for v in vals)
      + "</select></label>")
  filters = ("<div class='filters'>"
             f"<label>task <input data-filter='task' oninput=\"filterTable('{tid}')\" size='14'></label>"
             + sel("family", fams) + sel("success", ["1", "0", "none"], {"1": "pass", "0": "fail", "none": "n/a"})
             + sel("infra", kinds)
             + f"<label>turns ≥ <input data-filter='minturns' type='number' min='0' style='width:4em' "
             f"oninput=\"filterTable('{tid}')\"></label>"
             f" <span id='{tid}-count'>{len(recs)}</span> shown</div>")
  rows, attrs = [], []
  for i, r in enumerate(recs):
    succ = "none" if r.get("success") is None else str(r.get("success"))
    n = len(r.get("turns", []))
    attrs.append(f"data-task='{e(r.get('task', ''))}' data-family='{e(r.get('family', ''))}' data-success='{succ}' "
                 f"data-infra='{e(r.get('failure_kind') or '')}' data-turns='{n}'")
    rows.append([f"<a class='episode-link' href='/episode?{q(src=src, i=i)}'>{e(r.get('episode_id', str(i)))}</a>",
                 e(r.get("task", "")), e(r.get("family", "")), e(r.get("harness", "")),
                 f"<span data-sort='{succ}'>{_success(r.get('success'))}</span>",
                 f"{r.get('passed', 0)}/{r.get('total', 0)}", _fmt(r.get("reward")), str(n),
                 e(r.get("stop_reason", "")), e(r.get("failure_kind") or "")])
  return filters + table(["episode", "task", "family", "harness", "success", "checks", "reward", "turns", "stop",
                          "infra kind"], rows, f"id='{tid}'", sortable=True, row_attrs=attrs)


def step_page(run: RunFolder, phase: str, step: str | None, stage: str | None) -> str:
  src = step_file(phase, step if step is not None else stage)
  recs = run.episodes(src)
  title = f"{phase} step {step}" if step is not None else f"{phase} {stage} episodes"
  if not recs:
    return page(title, "<p class='muted'>no episode recorded (yet)</p>")
  return page(title, episodes_table(src, recs))


def episode_page(run: RunFolder, src: str, i: int) -> str:
  recs = run.episodes(src)
  if not 0 <= i < len(recs):
    raise FileNotFoundError(f"{src}#{i}")
  r = recs[i]
  vals = [abs(t[k]) for t in r["turns"] for k in ("value", "advantage") if t.get(k) is not None]
  vscale = max([abs(t["value"]) for t in r["turns"] if t.get("value") is not None] or [0.0])
  ascale = max([abs(t["advantage"]) for t in r["turns"] if t.get("advantage") is not None] or [0.0])
  info = [("task", f"{e(r['task'])} (<a href='#instruction'>instruction</a>)"), ("family", e(r.get("family", ""))),
          ("harness", e(r.get("harness", ""))), ("success", _success(r.get("success"))),
          ("verification", e(r.get("state", "")) + (f": {e(r['verifier_reason'])}" if r.get("verifier_reason") else "")),
          ("checks passed", f"{r.get('passed')}/{r.get('total')}"), ("reward", _fmt(r.get("reward"))),
          ("divisor", _fmt(r.get("divisor"))), ("stop reason", e(r.get("stop_reason", ""))),
          ("infrastructure kind", e(r.get("failure_kind") or "") or "<span class='muted'>none</span>"),
          ("weight versions", e(", ".join(str(v) for v in r.get("weight_versions", [])))),
          ("tokens", f"{r.get('prompt_tokens')} prompt, {r.get('generated_tokens')} generated"),
          ("output cap", f"{r.get('output_cap_bytes')} bytes"),
          ("times", e(", ".join(f"{k} {v}" for k, v in (r.get("times") or {}).items())))]
  for k in ("stage", "runbook", "repeat", "run", "tries", "attempt", "discovery_harness"):
    if k in r:
      info.append((k, _fmt(r[k])))
  if r.get("error"):
    info.append(("error", f"<pre>\n{e(r['error'])}</pre>"))
  body = "<div class='side'><div>" + table(None, [[k, v] for k, v in info], "id='info'") + "</div><div>"
  body += "<h2>Verifier checks</h2>" + (table(
      ["check", "status", "hygiene"],
      [[f"<span class='check-name'>{e(c['name'])}</span>",
        f"<span class='{'ok' if c['status'] == 'passed' else 'bad'}'>{e(c['status'])}</span>",
        "yes" if c.get("hygiene") else ""] for c in r.get("checks", [])], "id='checks'")
      if r.get("checks") else "<p class='muted'>no CTRF report</p>")
  body += "</div></div>"
  body += f"<h2>Turns ({len(r['turns'])})</h2>"
  if vals:
    body += (f"<p class='muted'>bars: critic value (full width = {vscale:.4g}) and TB-GAE advantage (full width = "
             f"{ascale:.4g}) at each turn's first generated token</p>")
  for t in r["turns"]:
    head = (f"turn {t['index']} ({e(t['kind'])}, segment {t['segment']}, weights v{t['weight_version']}, "
            f"{t['sampled_tokens']} tokens, finish {e(t['finish_reason'])})")
    parts = [f"<div class='turn' data-turn='{t['index']}'><b>{head}</b>"]
    if t.get("value") is not None or t.get("advantage") is not None:
      parts.append(f"<div><span class='lbl'>value</span>{bar_svg('value', t['index'], t.get('value'), vscale)}</div>"
                   f"<div><span class='lbl'>advantage</span>"
                   f"{bar_svg('advantage', t['index'], t.get('advantage'), ascale)}</div>")
    parts.append(f"<div>reply:</div><pre class='reply'>\n{e(t['reply'])}</pre>")
    if t.get("malformed"):
      parts.append(f"<div class='bad'>malformed: <span class='malformed'>{e(t['malformed'])}</span></div>")
    if t.get("command") is not None:
      parts.append(f"<div>command:</div><pre class='command'>\n{e(t['command'])}</pre>")
      parts.append(f"<div>output (exit {e(str(t.get('exit_code')))}{', timed out' if t.get('timed_out') else ''}, "
                   f"{t.get('duration_s')} s):</div><pre class='output'>\n{e(t['output'])}</pre>")
    elif t.get("output"):
      parts.append(f"<div>shown to the agent:</div><pre class='output'>\n{e(t['output'])}</pre>")
    if t.get("done"):
      parts.append("<div class='muted'>declared done</div>")
    parts.append("</div>")
    body += "".join(parts)
  body += (f"<h2 id='instruction'>Task instruction</h2><pre class='instruction'>\n{e(r.get('instruction') or '')}"
           f"</pre>")
  return page(f"episode {r.get('episode_id')} ({r['task']})", body)


def rsr_page(run: RunFolder, phase: str) -> str:
  """Per task: discovery episodes per harness -> runbooks (text, verdict, reasons) -> fresh executions ->
  accepted trajectories."""
  disc_src, exec_src = step_file(phase, "discovery"), step_file(phase, "execution")
  disc, execs = run.episodes(disc_src), run.episodes(exec_src)
  runbooks = run.rows(f"phases/{phase}/runbooks.jsonl")
  accepted = run.rows(f"phases/{phase}/q_clean.jsonl")
  man = run.manifest(phase)
  tasks = list(dict.fromkeys([r["task"] for r in disc] + [r["task"] for r in runbooks]))
  body = ""
  if man:
    st = man.get("stages", {})
    body += f"<p>run by {e(str(man.get('policy', '')))}: " + ", ".join(
        f"{e(k)} {v}" for k, v in st.items() if isinstance(v, int)) + "</p>"
  disc_index = {r["episode_id"]: i for i, r in enumerate(disc)}
  for task in tasks:
    body += f"<div class='funnel' data-task='{e(task)}'><h2>{e(task)}</h2><h3>discovery</h3>"
    by_h: dict[str, list] = {}
    for i, r in enumerate(disc):
      if r["task"] == task:
        by_h.setdefault(r["harness"], []).append((i, r))
    body += table(["harness", "episodes"], [[e(h), " ".join(
        f"<a href='/episode?{q(src=disc_src, i=i)}'>{_success(r.get('success'))} {e(r['episode_id'])}</a>"
        for i, r in eps)] for h, eps in by_h.items()])
    rbs = [(k, rb) for k, rb in enumerate(runbooks) if rb.get("task") == task]
    body += "<h3>runbooks and review</h3>"
    rows = []
    for k, rb in rbs:
      d = disc_index.get(rb.get("discovery"))
      src_link = (f"<a href='/episode?{q(src=disc_src, i=d)}'>{e(rb.get('discovery', ''))}</a>" if d is not None
                  else e(str(rb.get("discovery", ""))))
      ex = [(i, x) for i, x in enumerate(execs) if x.get("runbook") == k]
      rows.append([str(k), e(rb.get("harness", "")), src_link, f"<pre>\n{e(rb.get('runbook') or '')}</pre>",
                   "<span class='ok'>accepted</span>" if rb.get("accepted") else "<span class='bad'>rejected</span>",
                   e("; ".join(rb.get("reasons", []))) + (f"<br><span class='muted'>{e('; '.join(map(str, rb.get('details', []))))}</span>"
                                                           if rb.get("details") else ""),
                   " ".join(f"<a href='/episode?{q(src=exec_src, i=i)}'>{_success(x.get('success'))} "
                            f"{e(x['episode_id'])}</a>" for i, x in ex)])
    body += table(["#", "from harness", "discovery episode", "runbook", "review", "reasons", "fresh executions"], rows)
    by_kind = collections.defaultdict(list)  # None: accepted trajectories; planning / guided: demonstrations
    for a in accepted:
      if a.get("task") == task:
        by_kind[a.get("kind")].append(a)
    acc, demos, guided = by_kind[None], by_kind["planning"], by_kind["guided"]
    if demos:  # rsr.plan_demonstrations: accepted runbooks kept as SFT samples
      body += (f"<h3>planning demonstrations: {len(demos)}</h3><p>runbook(s) "
               f"{', '.join(_fmt(a.get('runbook')) for a in demos)} kept as SFT samples</p>")
    if guided:  # ... and accepted executions as they ran under their guidance
      body += (f"<h3>guided demonstrations: {len(guided)}</h3><p>execution(s) "
               f"{', '.join(e(a.get('episode_id', '')) for a in guided)} kept with their guidance as SFT samples</p>")
    body += f"<h3>accepted trajectories: {len(acc)}</h3>"
    if acc:
      body += table(["episode", "runbook", "repeat", "harness"], [
          [e(a.get("episode_id", "")), _fmt(a.get("runbook")), _fmt(a.get("repeat")), e(a.get("harness", ""))]
          for a in acc])
    body += "</div>"
  if not tasks:
    body += "<p class='muted'>no funnel record in this phase (yet)</p>"
  return page(f"RSR funnel {phase}", body)


def evaluations_page(run: RunFolder) -> str:
  return page("evaluations", eval_table(run))


def evaluation_page(run: RunFolder, phase: str, step: str) -> str:
  s = run.eval_summary(phase, step)
  src = eval_file(phase, step)
  recs = run.episodes(src)
  body = ""
  if s:
    body += (f"<p>Mean@{s.get('repeats')} {_fmt(s.get('mean_at_r'))} %, pass@{s.get('repeats')} "
             f"{_fmt(s.get('pass_at_r'))} %, process reward {_fmt(s.get('process_reward'))}, infrastructure "
             f"failures {_fmt(s.get('infra_failures'))}</p>")
  by_task: dict[str, list] = {}
  for i, r in enumerate(recs):
    by_task.setdefault(r["task"], []).append((i, r))
  rows = []
  for task, items in by_task.items():
    for i, r in sorted(items, key=lambda x: x[1].get("run", 0)):
      fails = [c["name"] for c in r.get("checks", []) if c["status"] != "passed" and not c.get("hygiene")]
      mode = r.get("failure_kind") or ("" if r.get("success") == 1 else (
          f"{len(fails)} check(s) failed" if fails else r.get("verifier_reason") or r.get("stop_reason", "")))
      rows.append([e(task), _fmt(r.get("run")), _success(r.get("success")), f"{r.get('passed')}/{r.get('total')}",
                   e(", ".join(fails)), e(mode), e(r.get("stop_reason", "")), str(len(r.get("turns", []))),
                   f"<a class='episode-link' href='/episode?{q(src=src, i=i)}'>transcript</a>"])
  body += table(["task", "repeat", "success", "checks", "failed checks", "failure mode", "stop", "turns", ""], rows,
                "id='attempts'", sortable=True) if rows else "<p class='muted'>no attempt transcripts</p>"
  return page(f"evaluation {phase} step {step}", body)
