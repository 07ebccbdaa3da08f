"""The command line of every entry point: absl flags with underscore names, then ``key=value`` config overrides.

Each entry point defines its flags on a :class:`absl.flags.FlagValues` of its own (so two entry points imported
in one process never clash) and reads its command line with :func:`parse`: ``--help`` prints the module's usage
and its flags (exit 0); an unknown flag, a bad value, a stray argument or an old spelling (``--hbm-gib``: the
hint names ``--hbm_gib``) is one line on stderr and exit status 2, before any work. :func:`check_output_folder`
refuses an output folder that cannot be written (also exit 2), and :func:`provide_cpu_devices` gives the CPU
backend the devices a config's mesh asks for.
"""

from __future__ import annotations

import _thread
import math
import os
import signal
import sys
import textwrap
import threading
from collections.abc import Mapping, Sequence

from absl import flags

HELP_FLAGS = ("-h", "-help", "--help", "--helpshort", "--helpfull")
_FORCE_COUNT = "xla_force_host_platform_device_count"


class UsageError(Exception):
  """A command line that cannot run: one line, exit status 2."""


class Terminated(SystemExit):
  """A SIGTERM (a preemption notice) that arrived where no run state could be saved yet: the process ends."""


class _RedeliverInterrupt:
  """``sys.unraisablehook``: a Ctrl-C or SIGTERM that landed in code whose exceptions Python can only report, not
  raise (a garbage-collection callback such as JAX's, which runs thousands of times while a program starts; a
  finalizer), is delivered to the main thread again instead of being lost; every other report goes to the hook
  before."""

  def __init__(self, before):
    self.before = before

  def __call__(self, u) -> None:
    signum = (signal.SIGINT if u.exc_type is not None and issubclass(u.exc_type, KeyboardInterrupt)
              else signal.SIGTERM if u.exc_type is not None and issubclass(u.exc_type, Terminated) else None)
    if signum is not None:
      # from another thread, a moment later: raised here, it would be reported (and lost) again
      t = threading.Timer(0.01, _thread.interrupt_main, args=(signum,))
      t.daemon = True
      t.start()
      return
    self.before(u)


_CTRL_C = threading.Event()  # set by _note_ctrl_c: a Ctrl-C arrived (whatever became of its KeyboardInterrupt)
_SIGTERM = threading.Event()  # set by _note_sigterm: a SIGTERM arrived (whatever became of its Terminated)


def _note_ctrl_c(signum, frame):
  _CTRL_C.set()
  signal.default_int_handler(signum, frame)


def _note_sigterm(signum, frame):
  _SIGTERM.set()
  raise Terminated(128 + signum)


def keep_stop_signals() -> None:
  """Never lose a Ctrl-C or a SIGTERM: one that lands where Python can only report it is delivered again
  (:class:`_RedeliverInterrupt`), and each is noted (:func:`ctrl_c_seen`, :func:`sigterm_seen`), for library code
  that turns the exception into an error of its own. A SIGTERM raises :class:`Terminated` (the default action
  would end the process without its teardown); where a run can stop at a safe point it installs its own handler
  (:class:`rsi_jax.pipeline.preemption.Stop`). Called first by the long-running entry points; a signal that is
  ignored (SIGINT in a background job) stays ignored."""
  if not isinstance(sys.unraisablehook, _RedeliverInterrupt):
    sys.unraisablehook = _RedeliverInterrupt(sys.unraisablehook)
  if threading.current_thread() is threading.main_thread():
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
      signal.signal(signal.SIGINT, _note_ctrl_c)
    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
      signal.signal(signal.SIGTERM, _note_sigterm)


def ctrl_c_seen() -> bool:
  """Whether a Ctrl-C arrived since :func:`keep_stop_signals` (e.g. while MaxText's imports build pydantic models:
  pydantic reports it as a ``SchemaError``)."""
  return _CTRL_C.is_set()


def sigterm_seen() -> bool:
  """Whether a SIGTERM arrived since :func:`keep_stop_signals` outside a run's own handler (e.g. while MaxText
  builds its config: OmegaConf reports what interrupted it as a ``ConfigKeyError``)."""
  return _SIGTERM.is_set()


def flag_values() -> flags.FlagValues:
  """An entry point's own flag set (define its flags with ``flag_values=``)."""
  return flags.FlagValues()


def fail(prog: str, message: str):
  """Print ``message`` as one line naming the program and exit with status 2."""
  text = " ".join(str(message).split())
  print(f"{prog}: {text} (--help lists the flags)", file=sys.stderr, flush=True)
  raise SystemExit(2)


def parse(fv: flags.FlagValues, argv: Sequence[str] | None, prog: str, doc: str, *, overrides: bool = True,
          renamed: Mapping[str, str] | None = None) -> list[str]:
  """Read ``argv`` (without the program name; default ``sys.argv[1:]``) into ``fv``, every flag from its default,
  and return the positional arguments. ``overrides``: they must be ``key=value`` config overrides (else none is
  allowed; the caller then takes the ones it expects). ``renamed``: old flag name -> what replaced it (a name
  with ``-`` for a flag with ``_`` is found without it)."""
  argv = list(sys.argv[1:] if argv is None else argv)
  flag_part = argv[:argv.index("--")] if "--" in argv else argv
  if any(a in HELP_FLAGS for a in flag_part):
    print(help_text(fv, doc))
    raise SystemExit(0)
  try:
    for a in flag_part:
      _check_spelling(fv, a, renamed or {})
    fv.unparse_flags()
    rest = fv([prog, *argv])[1:]
  except (UsageError, flags.Error) as e:
    fail(prog, str(e))
  if overrides:
    for a in rest:
      if "=" not in a or a.startswith("-"):
        fail(prog, f"{a!r} is not a key=value config override")
  flags.FLAGS.mark_as_parsed()  # absl logging reads its own (global) flags: their defaults
  return rest


def no_positional(prog: str, rest: Sequence[str], hint: str = ""):
  """Refuse positional arguments where an entry point takes none (``hint``: what to write instead)."""
  if rest:
    fail(prog, f"unexpected argument {rest[0]!r}" + (f": {hint}" if hint else ""))


def _check_spelling(fv: flags.FlagValues, arg: str, renamed: Mapping[str, str]):
  if not arg.startswith("-") or arg in ("-", "--"):
    return
  name = arg.lstrip("-").split("=", 1)[0]
  if name in fv or (name.startswith("no") and name[2:] in fv):
    return
  if name in renamed:
    raise UsageError(f"--{name} is now {renamed[name]}")
  if "-" in name and name.replace("-", "_") in fv:
    raise UsageError(f"--{name} is now --{name.replace('-', '_')}")


def help_text(fv: flags.FlagValues, doc: str) -> str:
  """The module's usage (its docstring) and one entry per flag with its default."""
  lines = [textwrap.dedent(doc).strip(), "", "flags:"]
  for name in sorted({fv[n].name for n in fv}):
    f = fv[name]
    kind, text = f.flag_type(), f.help.split(";\n")[0]  # absl's note on repeatable flags: the kind says it
    if hasattr(f.parser, "enum_values"):
      kind = "|".join(f.parser.enum_values)
      text = text.removeprefix(f"<{kind}>: ")
    kind = {"comma separated list of strings": "a,b,...", "multi string": "string, repeatable"}.get(kind, kind)
    default = "" if f.default in (None, "", [], False) else f" (default: {f.default_as_str or f.default})"
    lines.append(f"  --{name}" + ("" if kind == "bool" else f"=<{kind}>"))
    lines.extend(textwrap.wrap(text + default, 100, initial_indent="      ", subsequent_indent="      "))
  if "config" in fv:
    lines += ["", "positional arguments: key=value config overrides (dotted keys address a section's field)"]
  return "\n".join(lines)


def check_output_folder(path: str, flag: str):
  """A local output folder must be creatable and writable: an existing file, or a nearest existing parent that is
  a file or not writable, is a UsageError naming ``flag``. Object-store URLs are left to their backend."""
  if not path or "://" in path:
    return
  p = os.path.abspath(path)
  if os.path.exists(p) and not os.path.isdir(p):
    raise UsageError(f"--{flag}: {path} is an existing file, not a folder")
  problem = output_folder_problem(path)
  if problem:
    raise UsageError(f"--{flag}: {problem}")


def output_folder_problem(path: str) -> str:
  """Why a local output folder cannot be created and written ("" if it can): its nearest existing parent is a
  file or not writable. Object-store URLs are left to their backend."""
  if not path or "://" in path:
    return ""
  p = os.path.abspath(path)
  while not os.path.exists(p):
    p = os.path.dirname(p)
  if not os.path.isdir(p):
    return f"{p} is a file, not a folder (for {path})"
  if not os.access(p, os.W_OK | os.X_OK):
    return f"{p} is not writable (for {path})"
  return ""


def mesh_devices(mesh) -> int:
  """The fewest devices a ``mesh`` config section fits: the product of its fixed axes (``-1`` counts as 1)."""
  return math.prod(max(1, v) for _, v in mesh.items())


def provide_cpu_devices(mesh, distributed: bool = False) -> int | None:
  """Give JAX's CPU backend as many virtual devices as ``mesh`` (a config's mesh section) needs, when it needs
  more than one, nobody set a count (``XLA_FLAGS=--xla_force_host_platform_device_count``,
  ``JAX_NUM_CPU_DEVICES``), the platforms asked for start with the CPU (or none are named: an accelerator's
  backend is untouched) and this is not one process of a multi-process run. Call before JAX starts its
  backends; returns the count set, or None."""
  n = mesh_devices(mesh)
  platforms = os.environ.get("JAX_PLATFORMS", "").strip().lower()
  if (n <= 1 or distributed or _FORCE_COUNT in os.environ.get("XLA_FLAGS", "")
      or os.environ.get("JAX_NUM_CPU_DEVICES") or (platforms and not platforms.startswith("cpu"))):
    return None
  import jax
  try:
    jax.config.update("jax_num_cpu_devices", n)
  except RuntimeError:  # the backends already run: their devices stay as they are (pre-flight names the key)
    return None
  return n
