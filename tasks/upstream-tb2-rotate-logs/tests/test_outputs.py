import os
import subprocess
from pathlib import Path

SCRIPT = "/app/rotate.sh"


def rotate(*args):
    return subprocess.run([SCRIPT, *map(str, args)], capture_output=True, text=True, timeout=30)


def snapshot(directory):
    return {p.name: p.read_text() for p in sorted(Path(directory).iterdir())}


def test_script_is_executable():
    """rotate.sh exists and is executable."""
    assert os.path.isfile(SCRIPT) and os.access(SCRIPT, os.X_OK)


def test_first_rotation(tmp_path):
    """A fresh log becomes LOGFILE.1 and a new empty log is created."""
    log = tmp_path / "app.log"
    log.write_text("a\nb\n")
    assert rotate(log, 3).returncode == 0
    assert snapshot(tmp_path) == {"app.log": "", "app.log.1": "a\nb\n"}


def test_rotation_shifts_and_drops_the_oldest(tmp_path):
    """Old copies shift up by one and at most KEEP of them remain."""
    log = tmp_path / "app.log"
    for name, text in {"app.log": "new\n", "app.log.1": "one\n", "app.log.2": "two\n",
                       "app.log.3": "three\n"}.items():
        (tmp_path / name).write_text(text)
    assert rotate(log, 3).returncode == 0
    assert snapshot(tmp_path) == {"app.log": "", "app.log.1": "new\n", "app.log.2": "one\n",
                                  "app.log.3": "two\n"}
    (tmp_path / "app.log").write_text("newer\n")
    assert rotate(log, 1).returncode == 0
    assert snapshot(tmp_path) == {"app.log": "", "app.log.1": "newer\n", "app.log.2": "one\n",
                                  "app.log.3": "two\n"}


def test_empty_or_missing_log_is_left_alone(tmp_path):
    """Nothing happens for an empty or missing log."""
    (tmp_path / "app.log").write_text("")
    (tmp_path / "app.log.1").write_text("old\n")
    assert rotate(tmp_path / "app.log", 2).returncode == 0
    assert rotate(tmp_path / "missing.log", 2).returncode == 0
    assert snapshot(tmp_path) == {"app.log": "", "app.log.1": "old\n"}


def test_bad_arguments(tmp_path):
    """Missing or non-positive KEEP gives status 2 and touches nothing."""
    log = tmp_path / "app.log"
    log.write_text("x\n")
    for args in ([log], [log, 0], [log, "two"], [log, -1]):
        proc = rotate(*args)
        assert proc.returncode == 2 and proc.stderr.strip(), args
    assert snapshot(tmp_path) == {"app.log": "x\n"}
