"""Run the reference solutions of upstream task folders and print what verifies, what is refused and why.

    python scripts/check_upstream.py DATASET_DIR [DATASET_DIR ...] [--n N] [--output DIR] [key=value ...]

Each DATASET_DIR is a folder of task folders (Terminal-Bench 1 ``task.yaml`` or Harbor / TB2 ``task.toml``),
used unchanged. ``--n N`` takes N of them, evenly spread over the sorted folder names (the whole folder by
default). For each dataset it runs ``python -m rsi_jax.eval --harness=oracle --repeats=1`` (the training
program's own loading, image building, sandbox and protected verifier) and prints one table:

    dataset  task  loaded  verified  kind  seconds  reason

``kind`` is what stopped a task that did not verify: ``refused`` (the loader's reason: a malformed folder, an
image only a registry has, ...), an infrastructure kind (``build_failed``, ``needs_network``, ``verifier_error``,
...; never scored), or ``scored_0`` (the verifier ran and the reference solution failed — the number that must be
0 for an environment that runs upstream tasks as upstream does). A build or test that failed for want of a host
this machine cannot reach is marked ``unreachable``; the last line gives the share of the other tasks that
verify. Extra ``key=value`` arguments are config overrides (e.g. ``env.concurrency=4``). Exit status 0 when every
dataset ran (whatever verified), 2 when one could not be evaluated.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from rsi_jax.pipeline.metrics import read_jsonl

REPO = Path(__file__).resolve().parents[1]
# Messages that say a build or a test needed a host this machine cannot reach.
UNREACHABLE = re.compile(
    r"could not resolve host|temporary failure in name resolution|name or service not known|"
    r"network is unreachable|failed to establish a new connection|getaddrinfo|unknownhostexception|"
    r"unable to find the server|eai_again|enotfound|no route to host|connection timed out|could not connect to|"
    r"only a registry has|registry_only|dial tcp|i/o timeout|tls handshake timeout|"
    r"proxy ?error|403 forbidden|407 proxy", re.IGNORECASE)


def task_folders(root: Path) -> list[str]:
  """The folders of ``root`` (every one: the loader decides what is a task and says why one is not)."""
  return sorted(d.name for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))


def sample(names: list[str], n: int | None) -> list[str]:
  """``n`` of ``names``, evenly spread (all of them when ``n`` is None or not smaller)."""
  if not n or n >= len(names):
    return list(names)
  return [names[(i * len(names)) // n] for i in range(n)]


def rows(dataset: str, names: list[str], out_dir: Path) -> list[dict]:
  """One row per task folder from the evaluation's ``summary.json`` and ``attempts.jsonl``."""
  summary = json.loads((out_dir / "summary.json").read_text()) if (out_dir / "summary.json").is_file() else {}
  attempts = {a["task"]: a for a in read_jsonl(out_dir / "attempts.jsonl")}
  refused = {r["task"]: r["reason"] for r in summary.get("refused") or []}
  out = []
  for name in names:
    row = {"dataset": dataset, "task": name, "loaded": name not in refused, "verified": False, "kind": "",
           "seconds": None, "reason": ""}
    if name in refused:
      row.update(kind="refused", reason=refused[name])
    elif name in attempts:
      a = attempts[name]
      row["seconds"] = a.get("seconds")
      if a.get("infra_failure"):
        row.update(kind=a.get("failure_kind") or "infra", reason=a.get("error") or a.get("reason") or "")
      elif a.get("success"):
        row["verified"] = True
      else:
        row.update(kind="scored_0", reason=a.get("reason") or f"{a.get('passed')}/{a.get('total')} checks passed")
    else:
      row.update(kind="missing", reason="neither evaluated nor refused")
    row["unreachable"] = bool(row["kind"] not in ("", "scored_0") and UNREACHABLE.search(row["reason"]))
    out.append(row)
  return out


def render(table: list[dict]) -> str:
  """The table and its totals."""
  head = ("dataset", "task", "loaded", "verified", "kind", "seconds", "reason")
  cells = [[r["dataset"], r["task"], "yes" if r["loaded"] else "no", "yes" if r["verified"] else "no",
            r["kind"] + (" (unreachable)" if r["unreachable"] else ""),
            "" if r["seconds"] is None else f"{r['seconds']:.0f}",
            " ".join(str(r["reason"]).split())[:110]] for r in table]
  widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h) for i, h in enumerate(head)]
  fmt = lambda c: "  ".join(x.ljust(w) for x, w in zip(c, widths)).rstrip()  # noqa: E731
  lines = [fmt(head), fmt(["-" * w for w in widths]), *map(fmt, cells), ""]
  n = len(table)
  reach = [r for r in table if not r["unreachable"]]
  ok = sum(r["verified"] for r in table)
  kinds: dict[str, int] = {}
  for r in table:
    if not r["verified"]:
      kinds[r["kind"]] = kinds.get(r["kind"], 0) + 1
  lines.append(", ".join([f"tasks {n}: verified {ok}", *(f"{k} {v}" for k, v in sorted(kinds.items()))]))
  lines.append(f"unreachable requirements {n - len(reach)}; of the other {len(reach)}: verified "
               f"{sum(r['verified'] for r in reach)} ({100.0 * sum(r['verified'] for r in reach) / max(1, len(reach)):.1f}%), "
               f"scored 0 {sum(r['kind'] == 'scored_0' for r in reach)}")
  return "\n".join(lines)


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("datasets", nargs="+", help="folders of task folders (key=value arguments are overrides)")
  ap.add_argument("--n", type=int, default=None, help="tasks per dataset, evenly spread (default: all)")
  ap.add_argument("--output", default="runs/check_upstream", help="where each dataset's evaluation is written")
  ap.add_argument("--config", default="configs/base.yml")
  args = ap.parse_intermixed_args(argv)
  overrides = [a for a in args.datasets if "=" in a and not Path(a).is_dir()]
  datasets = [Path(a) for a in args.datasets if a not in overrides]
  table, rc = [], 0
  for ds in datasets:
    if not ds.is_dir():
      print(f"check_upstream: {ds}: not a folder", file=sys.stderr)
      return 2
    names = sample(task_folders(ds), args.n)
    if not names:
      print(f"check_upstream: {ds}: no folders in it", file=sys.stderr)
      rc = 2
      continue
    out = Path(args.output) / ds.resolve().name
    cmd = [sys.executable, "-m", "rsi_jax.eval", f"--config={args.config}", "--harness=oracle", "--repeats=1",
           f"--tasks_dir={ds}", f"--tasks={','.join(names)}", f"--output={out}", "eval.infra_retries=0",
           *overrides]
    print(f"[check_upstream] {ds}: {len(names)} task folder(s) -> {out}", flush=True)
    p = subprocess.run(cmd, cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    if p.returncode != 0:
      print(f"check_upstream: evaluating {ds} exited {p.returncode}", file=sys.stderr)
      rc = 2
      continue
    table += rows(ds.resolve().name, names, out)
  print(render(table))
  Path(args.output).mkdir(parents=True, exist_ok=True)
  (Path(args.output) / "table.json").write_text(json.dumps(table, indent=1) + "\n")
  return rc


if __name__ == "__main__":
  sys.exit(main())
