"""Run browser entry point.

    python -m rsi_jax.view RUN_DIR [--port=8080] [--host=127.0.0.1]

Serves a local web page over a run folder (``<run.output_dir>/<run.name>``, a local path or ``gs://...``): the
run (phase plan with weight lineage, metric curves per phase, evaluation Mean@R per stage), each rollout step's
episodes (a table sortable and filterable by task, family, success, infrastructure kind and turns), each
episode (turn by turn: reply, command, output, critic value and TB-GAE advantage as bars, verifier checks, the
task's instruction), the RSR funnel per task and each evaluation per task and repeat. Pages are read from the
folder when asked for, so a run still going shows what is there. Everything is served from this process (no
CDN). On a remote machine: ``ssh -L 8080:localhost:8080 HOST`` and open http://localhost:8080/ here.
``--port=0`` takes any free port. Ctrl-C stops it.

Exit status 0 when stopped with Ctrl-C, 2 for a usage error (an unknown flag, no or two run folders, a run
folder that does not exist, a port that cannot be bound; one line).
"""

from __future__ import annotations

import sys

from absl import flags

from rsi_jax import cli

PROG = "python -m rsi_jax.view"
FLAGS = cli.flag_values()
_PORT = flags.DEFINE_integer("port", 8080, "Port to serve on (0: any free port).", lower_bound=0, upper_bound=65535,
                             flag_values=FLAGS)
_HOST = flags.DEFINE_string("host", "127.0.0.1", "Address to bind (0.0.0.0: every interface).", flag_values=FLAGS)


def main(argv=None) -> int:
  rest = cli.parse(FLAGS, argv, PROG, __doc__, overrides=False)
  if len(rest) != 1:
    cli.fail(PROG, "give one run folder: python -m rsi_jax.view RUN_DIR" if not rest
             else f"unexpected argument {rest[1]!r}: give one run folder")
  from etils import epath
  run_dir = rest[0]
  if not epath.Path(run_dir).is_dir():
    cli.fail(PROG, f"{run_dir}: no such run folder")
  from rsi_jax.view.server import make_server
  try:
    srv = make_server(run_dir, _HOST.value, _PORT.value)
  except OSError as e:
    cli.fail(PROG, f"cannot serve on {_HOST.value}:{_PORT.value}: {e.strerror or e}")
  host, port = srv.server_address[:2]
  print(f"serving {run_dir} at http://{host}:{port}/ (Ctrl-C stops)", flush=True)
  try:
    srv.serve_forever()
  except KeyboardInterrupt:
    pass
  finally:
    srv.server_close()
  return 0


if __name__ == "__main__":
  sys.exit(main())
