"""Stage reports across checkpoints (paper Table 2, Fig. 5, Fig. 10).

    python -m rsi_jax.eval.report --runs=DIR1,DIR2,... [--names=Base,RSR-1,...] --output=DIR
    python -m rsi_jax.eval.report --run_dir=runs/smoke [--output=DIR]   (default: <run>/eval/report)

A stage is an evaluation folder written by ``python -m rsi_jax.eval --output=DIR`` (``summary.json``), or a
folder of such folders, one per suite. ``--run_dir`` takes a training run's in-training evaluations: the
last one of each phase (``<run>/eval/<phase>/<step>/``, ``base`` first when it exists). The report is
``report.md`` and ``report.json``: Mean@R per suite and stage with the change in points against the previous
stage and each suite's best stage in bold, the mean over suites, task-weighted scores per frozen difficulty
stratum (as the headline: infrastructure failures left out and counted beside the score; "n/a (k infra)" where
nothing was scored), the task folders each evaluation refused with their reasons, and PNG plots of the
progression (``progression.png``, Fig. 5) and of each stratum (``strata.png``, Fig. 10). Exit status 0 written,
2 a usage error (one line, before anything is read: an unknown flag, ``--runs`` without ``--output``, an
``--output`` that names a file) or a stage that cannot be read.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from absl import flags
from etils import epath

from rsi_jax import cli
from rsi_jax.eval.strata import STRATA

SUMMARY = "summary.json"


def load_stage(path: str | Path) -> dict[str, dict]:
  """{suite: summary} of one stage folder (its own ``summary.json``, or one per sub-folder)."""
  p = epath.Path(path)  # a local folder or an object-store URL (a gs:// run folder)
  files = [p / SUMMARY] if (p / SUMMARY).exists() else sorted(p.glob(f"*/{SUMMARY}"))
  if not files:
    raise FileNotFoundError(f"{p}: no {SUMMARY} (an evaluation folder of python -m rsi_jax.eval --output)")
  out = {}
  for f in files:
    s = json.loads(f.read_text())
    suite = s.get("suite") or f.parent.name
    if suite in out:
      raise ValueError(f"{p}: suite {suite!r} evaluated twice")
    out[suite] = s
  return out


def run_stages(run_dir: str | Path) -> list[tuple[str, Path]]:
  """(stage name, folder) of a training run's in-training evaluations: ``base`` first (when it exists),
  then each phase of ``lineage.json`` in order, its last evaluation."""
  rd = epath.Path(run_dir)
  ev = rd / "eval"
  phases = []
  lineage = rd / "lineage.json"
  if lineage.exists():
    phases = [e["phase"] for e in json.loads(lineage.read_text())]
  out = []
  for name in ["base", *phases]:
    steps = sorted((d for d in (ev / name).glob("*") if d.is_dir() and d.name.isdigit()), key=lambda d: int(d.name))
    if steps:
      out.append((name, steps[-1]))
  if not out:
    raise FileNotFoundError(f"{rd}: no in-training evaluations under {ev} (set eval.tasks_dir to have them)")
  return out


def _fmt(x: float | None) -> str:
  return "–" if x is None else f"{x:.2f}"


def build(stages: Sequence[tuple[str, dict[str, dict]]]) -> dict:
  """The report's content from [(stage name, {suite: summary})]."""
  names = [n for n, _ in stages]
  suites = sorted({s for _, d in stages for s in d})
  table = {}
  for suite in suites:
    row, prev = {}, None
    for name, d in stages:
      s = d.get(suite)
      v = None if s is None else s.get("mean_at_r")
      row[name] = {"mean_at_r": v, "pass_at_r": None if s is None else s.get("pass_at_r"),
                   "mean_at_r_with_infra_as_failure": None if s is None else s.get("mean_at_r_with_infra_as_failure"),
                   "infra_failures": None if s is None else s.get("infra_failures"),
                   "n_tasks": None if s is None else s.get("n_tasks"),
                   "delta": None if v is None or prev is None else v - prev}
      prev = v if v is not None else prev
    vals = [r["mean_at_r"] for r in row.values() if r["mean_at_r"] is not None]
    best = max(vals) if vals and min(vals) < max(vals) else None  # all equal: no stage is best
    for r in row.values():
      r["best"] = best is not None and r["mean_at_r"] == best
    table[suite] = row
  mean_row, prev = {}, None
  for name in names:
    vals = [table[s][name]["mean_at_r"] for s in suites if table[s][name]["mean_at_r"] is not None]
    v = float(np.mean(vals)) if vals and len(vals) == len(suites) else None
    mean_row[name] = {"mean_at_r": v, "delta": None if v is None or prev is None else v - prev}
    prev = v if v is not None else prev
  vals = [r["mean_at_r"] for r in mean_row.values() if r["mean_at_r"] is not None]
  for r in mean_row.values():
    r["best"] = bool(vals) and min(vals) < max(vals) and r["mean_at_r"] == max(vals)
  strata = {}
  for suite in suites:
    rows = {}
    for name, d in stages:
      for k, v in ((d.get(suite) or {}).get("by_stratum") or {}).items():
        rows.setdefault(k, {})[name] = v
    strata[suite] = {k: rows[k] for k in (*STRATA, "unstratified") if k in rows}
  refused = [{"stage": name, "suite": suite, **r} for name, d in stages for suite in suites
             for r in ((d.get(suite) or {}).get("refused") or [])]
  return {"stages": names, "suites": suites, "mean_at_r": table, "suite_mean": mean_row, "strata": strata,
          "refused": refused}


def _stratum_cell(v: dict) -> str:
  """A stratum's score, with the infrastructure failures left out of it beside it."""
  infra = v.get("infra_failures") or 0
  note = f" ({infra} infra)" if infra else ""
  return ("n/a" if v.get("score") is None else _fmt(v["score"])) + note


def to_markdown(rep: dict) -> str:
  """Table 2 style: Mean@R per suite and stage, (change in points vs the previous stage), best in bold."""
  names = rep["stages"]

  def cell(r):
    if r["mean_at_r"] is None:
      return "–"
    text = _fmt(r["mean_at_r"]) + ("" if r["delta"] is None else f" ({r['delta']:+.2f})")
    return f"**{text}**" if r["best"] else text

  lines = ["# Evaluation report", "", "Mean@R (%) per suite and stage; in brackets the change in points against "
           "the previous stage; each row's best stage in bold (none where all are equal). Infrastructure failures are left out of the "
           "headline (see report.json for the figures that count them as failures).", "",
           "| Suite | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
  for suite in rep["suites"]:
    lines.append(f"| {suite} | " + " | ".join(cell(rep["mean_at_r"][suite][n]) for n in names) + " |")
  if len(rep["suites"]) > 1:
    lines.append("| Mean | " + " | ".join(cell(rep["suite_mean"][n]) for n in names) + " |")
  for suite, rows in rep["strata"].items():
    if not rows:
      continue
    lines += ["", f"## {suite}: task-weighted score (%) per difficulty stratum", ""]
    if any(v.get("infra_failures") for per in rows.values() for v in per.values()):
      lines += ["As in the headline, tasks whose attempts were all infrastructure failures are left out of a score; "
                "the infrastructure failures are counted beside it (n/a: nothing scored).", ""]
    lines += ["| Stratum | Tasks | " + " | ".join(names) + " |", "|---|---:|" + "---:|" * len(names)]
    for k, per in rows.items():
      tasks = next(iter(per.values()))["tasks"]
      lines.append(f"| {k} | {tasks} | " + " | ".join(_stratum_cell(per[n]) if n in per else "–" for n in names)
                   + " |")
  if rep.get("refused"):
    lines += ["", "## Refused task folders (not evaluated)", "", "| Stage | Suite | Task | Reason |",
              "|---|---|---|---|"]
    lines += [f"| {r['stage']} | {r['suite']} | {_cell_text(r['task'])} | {_cell_text(r['reason'])} |"
              for r in rep["refused"]]
  return "\n".join(lines) + "\n"


def _cell_text(text: str) -> str:
  return " ".join(str(text).split()).replace("|", "\\|")


def plot(rep: dict, out_dir: epath.Path) -> list[epath.Path]:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  names = rep["stages"]
  x = np.arange(len(names))
  files = []
  fig, ax = plt.subplots(figsize=(max(5, 1.4 * len(names)), 3.6), dpi=120)
  for suite in rep["suites"]:
    ys = [rep["mean_at_r"][suite][n]["mean_at_r"] for n in names]
    ax.plot(x, [np.nan if y is None else y for y in ys], marker="o", lw=1.2, alpha=0.8, label=suite)
  if len(rep["suites"]) > 1:
    ys = [rep["suite_mean"][n]["mean_at_r"] for n in names]
    ax.plot(x, [np.nan if y is None else y for y in ys], marker="s", lw=2.6, color="black", label="suite mean")
  files.append(_finish(plt, fig, ax, x, names, "Mean@R (%)", "Evaluation across stages", out_dir / "progression.png"))
  # strata: tasks pooled over suites, task-weighted
  pooled = {}
  for rows in rep["strata"].values():
    for k, per in rows.items():
      for n, v in per.items():  # over the scored tasks (None: nothing scored)
        t, sc = pooled.setdefault(k, {}).get(n, (0, 0.0))
        w = v.get("scored_tasks", v["tasks"]) if v.get("score") is not None else 0
        pooled[k][n] = (t + w, sc + (v["score"] or 0.0) * w)
  if pooled:
    fig, ax = plt.subplots(figsize=(max(5, 1.4 * len(names)), 3.6), dpi=120)
    shades = {"Easy": "#9ecae1", "Medium": "#4292c6", "Hard": "#08519c", "Extreme": "#08306b",
              "unstratified": "#999999"}
    for k, per in pooled.items():
      ys = [per[n][1] / per[n][0] if n in per and per[n][0] else np.nan for n in names]
      ax.plot(x, ys, marker="o", lw=1.8, color=shades.get(k), label=f"{k} ({next(iter(per.values()))[0]} tasks)")
    files.append(_finish(plt, fig, ax, x, names, "task-weighted score (%)",
                         "Difficulty strata (frozen structural proxies)", out_dir / "strata.png"))
  return files


def _finish(plt, fig, ax, x, names, ylabel: str, title: str, path: epath.Path) -> epath.Path:
  ax.set_xticks(x, names)
  ax.set_ylabel(ylabel)
  ax.set_ylim(-1, max(5.0, ax.get_ylim()[1]))  # percentages: from 0 (points at 0 stay visible), at least 5
  ax.set_title(title)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  fig.tight_layout()
  with path.open("wb") as f:  # through the path's own file system (an object store too)
    fig.savefig(f, format="png")
  plt.close(fig)
  return path


def write_report(stages: Sequence[tuple[str, dict[str, dict]]], out_dir: str | Path) -> dict:
  """report.md, report.json and the plots into ``out_dir``; returns the report's content."""
  d = epath.Path(out_dir)
  d.mkdir(parents=True, exist_ok=True)
  rep = build(stages)
  (d / "report.md").write_text(to_markdown(rep))
  (d / "report.json").write_text(json.dumps(rep, indent=1) + "\n")
  rep["plots"] = [str(p) for p in plot(rep, d)]
  return rep


def report_run(run_dir: str | Path, out_dir: str | Path | None = None) -> dict:
  """The report over a training run's phases (``<run>/eval/report/`` by default)."""
  stages = [(name, load_stage(path)) for name, path in run_stages(run_dir)]
  return write_report(stages, out_dir or epath.Path(run_dir) / "eval" / "report")


PROG = "python -m rsi_jax.eval.report"


FLAGS = cli.flag_values()
flags.DEFINE_list("runs", [], "Stage folders (evaluation outputs), in order.", flag_values=FLAGS)
flags.DEFINE_list("names", [], "Stage names (default: the folder names).", flag_values=FLAGS)
flags.DEFINE_string("run_dir", "", "A training run folder: its in-training evaluations.", flag_values=FLAGS)
flags.DEFINE_string("output", "", "Report folder (required with --runs; with --run_dir default <run>/eval/report).",
                    flag_values=FLAGS)


def main(argv=None) -> int:
  cli.no_positional(PROG, cli.parse(FLAGS, argv, PROG, __doc__, overrides=False))
  runs, names, run_dir = FLAGS.runs, FLAGS.names, FLAGS.run_dir
  try:
    if bool(run_dir) == bool(runs):
      raise cli.UsageError("give --runs=DIR1,DIR2,... (with --output=DIR) or --run_dir=RUN")
    if runs and not FLAGS.output:
      raise cli.UsageError("--output: required with --runs (the report folder)")
    if names and len(names) != len(runs):
      raise cli.UsageError(f"--names gives {len(names)} names for {len(runs)} runs")
    cli.check_output_folder(FLAGS.output, "output")
  except cli.UsageError as e:
    cli.fail(PROG, str(e))
  try:
    if run_dir:
      rep = report_run(run_dir, FLAGS.output or None)
      out = epath.Path(FLAGS.output or epath.Path(run_dir) / "eval" / "report")
    else:
      names = names or [Path(r).name for r in runs]
      out = epath.Path(FLAGS.output)
      rep = write_report([(n, load_stage(r)) for n, r in zip(names, runs)], out)
  except (FileNotFoundError, ValueError) as e:
    print(f"cannot report: {e}", file=sys.stderr)
    return 2
  print((out / "report.md").read_text())
  print(f"report: {out / 'report.md'}, {out / 'report.json'}, plots: {', '.join(rep['plots'])}")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
