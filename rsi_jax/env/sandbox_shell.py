"""The bash a sandbox runs in its container: PID 1, an agent command's shell, its collector, a trusted command.

Used by :class:`rsi_jax.env.sandbox.DockerSandbox`. An agent command's script restores the episode's shell state
from :data:`SHELL_DIR`, starts a watchdog in a session of its own that kills the command's process group at the
timeout, writes the output to a file there and prints it back capped, followed by :data:`EXIT_TRAILER` and the
exit code. That result is also kept in a file until the next command starts: Docker can lose a short exec's
output stream (moby/moby#27289; seen here once as an empty ``pwd`` on a loaded machine), and then
:data:`COLLECT_SCRIPT` reads it back, or, for a command that was killed, what it had printed. A trusted command's
output is kept the same way, and read back by a plain copy (:data:`RAW_SCRIPT`). :func:`split_trailer` reads the
trailer.
"""

import re

# The folder of the persistent shell's state, output files and watchdog marks (the scripts below name it).
SHELL_DIR = "/tmp/.rsi_shell"

# PID 1: a bash that reaps orphans. It installs no signal handler, so as a namespace's init it ignores every
# signal sent from inside (an agent cannot end its own container) and survives `kill -KILL -1`; teardown
# kills it from outside.
INIT_CMD = ["/bin/bash", "-c", "while :; do /usr/bin/sleep 86400 & wait $!; done"]

# One agent command. argv: $1 command id, $2 timeout (s), $3 output cap (bytes); env RSI_CMD: the command.
SHELL_SCRIPT = r"""
__rsi_d=/tmp/.rsi_shell; __rsi_id=$1; __rsi_o=$__rsi_d/out.$1; __rsi_r=$__rsi_d/result.$1
/usr/bin/mkdir -p "$__rsi_d"
/usr/bin/rm -f "$__rsi_d"/result.*  # the host has read every earlier command's result
echo $$ > "$__rsi_d/pid.$1"
/usr/bin/setsid /bin/bash -c '/usr/bin/sleep "$1"; : > "$2"; kill -KILL -- -"$3"' _ "$2" \
  "$__rsi_d/timeout.$1" $$ </dev/null >/dev/null 2>&1 &
__rsi_wd=$!
__rsi_cap=$3
exec 3>&1 1>/dev/null 2>/dev/null
[ -f "$__rsi_d/state" ] && . "$__rsi_d/state"
__rsi_exit() {
  __rsi_rc=$?
  set +e +u +o pipefail  # the command's own shell options (set -euo pipefail) end with it
  { export -p; printf 'cd -- %q\n' "$PWD"; } > "$__rsi_d/state.tmp" && /usr/bin/mv -f "$__rsi_d/state.tmp" "$__rsi_d/state"
  kill -KILL -- -"$__rsi_wd" 2>/dev/null || kill -KILL "$__rsi_wd" 2>/dev/null  # (not yet its own group)
  __rsi_n=$(/usr/bin/stat -c %s "$__rsi_o" || echo 0)
  {
    if [ "$__rsi_n" -le "$__rsi_cap" ]; then /usr/bin/cat "$__rsi_o"
    else
      /usr/bin/head -c $((__rsi_cap / 2)) "$__rsi_o"
      printf '\n[... %d bytes of output elided ...]\n' $((__rsi_n - __rsi_cap))
      /usr/bin/tail -c $((__rsi_cap - __rsi_cap / 2)) "$__rsi_o"
    fi
    printf '\036RSI:%d\036' "$__rsi_rc"
  } > "$__rsi_r"
  /usr/bin/rm -f "$__rsi_o"
  /usr/bin/cat "$__rsi_r" >&3
  exit $__rsi_rc
}
trap __rsi_exit EXIT
__rsi_c=$RSI_CMD; unset RSI_CMD
eval "$__rsi_c" >"$__rsi_o" 2>&1 </dev/null 3>&-
"""

EXIT_TRAILER = b"\x1eRSI:"  # the exit trap's trailer: output, then \x1eRSI:<exit code>\x1e

# When the host got no trailer: the result of a command that finished (its output stream lost), else what a
# killed command had printed, capped the same way. argv: $1 id, $2 cap.
COLLECT_SCRIPT = r"""
r=/tmp/.rsi_shell/result.$1
if [ -f "$r" ]; then echo DONE; cat "$r"; exit 0; fi
o=/tmp/.rsi_shell/out.$1; cap=$2
[ -f /tmp/.rsi_shell/timeout.$1 ] && echo TIMEOUT || echo KILLED
n=$(stat -c %s "$o" 2>/dev/null || echo 0)
if [ "$n" -le "$cap" ]; then cat "$o" 2>/dev/null
else head -c $((cap / 2)) "$o"; printf '\n[... %d bytes of output elided ...]\n' $((n - cap)); tail -c $((cap - cap / 2)) "$o"; fi
rm -f "$o" /tmp/.rsi_shell/timeout.$1
"""

# A trusted command with a fixed environment and a hard timeout on its whole process group, its output followed
# by EXIT_TRAILER and its exit code (a command that ended without one lost its output stream). Its output and
# trailer are also kept in $RSI_RAW_OUT, from where the host reads them back when Docker loses the exec's output
# stream (moby/moby#27289; a short command on a loaded machine) or the command is killed; $RSI_RAW_DONE: the
# kept outputs the host has read. argv: cmd...
RAW_SCRIPT = r"""
/usr/bin/setsid /bin/bash -c '/usr/bin/sleep "$1"; kill -KILL -- -"$2"' _ "$RSI_TIMEOUT" $$ \
  </dev/null >/dev/null 2>&1 &
w=$!
disown "$w"
rm -f -- $RSI_RAW_DONE 2>/dev/null
o=$RSI_RAW_OUT kept=
unset RSI_RAW_OUT RSI_RAW_DONE  # (not the command's business)
if { : >"$o"; } 2>/dev/null && exec 4<"$o"; then
  exec 3>&1 >>"$o" 2>&1  # one stream (Docker delivers stdout and stderr in no fixed order), kept
  kept=1
else
  exec 2>&1  # /tmp is not writable: the stream only
fi
"$@" 3>&- 4<&-
rc=$?
kill -KILL -- -"$w" 2>/dev/null
printf '\036RSI:%d\036' $rc
if [ -n "$kept" ]; then exec >&3 3>&-; cat <&4; fi  # (from the open file: the command may have removed it)
exit $rc
"""


TRAILER_RE = re.compile(re.escape(EXIT_TRAILER) + rb"(-?\d+)\x1e")


def split_trailer(out: bytes) -> tuple[bytes, int] | None:
  """A shell's output and the exit code its :data:`EXIT_TRAILER` gives, or None where the trailer is missing.
  Output after the trailer (a child still writing after the command ended) is kept, after the rest."""
  last = None
  for last in TRAILER_RE.finditer(out):
    pass
  if last is None:
    return None
  return out[:last.start()] + out[last.end():], int(last.group(1))
