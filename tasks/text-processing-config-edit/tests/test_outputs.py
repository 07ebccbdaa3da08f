"""Checks the in-place edits of app.conf, one requirement per check plus the whole file (6 checks)."""

from pathlib import Path

CONF = Path("/app/app.conf")
EXPECTED = Path(__file__).with_name("expected.conf").read_text()


def sections():
  """{section: [(key, value)]} of the agent's file; comment and blank lines are skipped."""
  assert CONF.is_file(), "/app/app.conf is missing"
  out, name = {}, ""
  for line in CONF.read_text().splitlines():
    s = line.strip()
    if s.startswith("[") and s.endswith("]"):
      name = s[1:-1]
      out[name] = []
    elif "=" in s and not s.startswith(("#", ";")):
      k, v = s.split("=", 1)
      out.setdefault(name, []).append((k.strip(), v.strip()))
  return out


def test_server_port_changed_other_ports_kept():
  s = sections()
  assert dict(s["server"])["port"] == "9090"
  assert dict(s["database"])["port"] == "5432" and dict(s["cache"])["port"] == "6379"


def test_server_workers_changed_other_keys_kept():
  server = dict(sections()["server"])
  assert server["workers"] == "8"
  assert server["host"] == "0.0.0.0" and server["keepalive"] == "5"


def test_debug_switched_off_everywhere():
  s = sections()
  assert all(dict(s[name])["debug"] == "false" for name in ("server", "database", "cache", "reports"))
  assert dict(s["reports"])["debugger_path"] == "/usr/bin/true"


def test_comments_removed_semicolon_lines_kept():
  text = CONF.read_text()
  assert not any(line.lstrip().startswith("#") for line in text.splitlines())
  assert "; semicolon lines are not comments for this task" in text.splitlines()


def test_database_timeout_is_last_key():
  db = sections()["database"]
  assert db[-1] == ("timeout", "30")
  assert sum(k == "timeout" for name in sections() for k, _ in sections()[name]) == 1


def test_whole_file_matches():
  assert CONF.read_text() == EXPECTED
