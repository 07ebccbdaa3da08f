from pathlib import Path

TODOS = Path("/app/todos.txt")
EXPECTED = [
    "app/core/engine.py:2:validate args before running",
    "app/core/engine.py:4:use logging instead of print",
    "app/core/util.sh:2:support macOS date",
    "app/core/util.sh:3:check TZ; TODO: check locale",
    "app/main.py:7:parse command line options",
    "docs/notes.md:3:write the user guide",
]


def lines():
    assert TODOS.exists(), "/app/todos.txt was not created"
    return TODOS.read_text().splitlines()


def test_todo_file_exists():
    assert TODOS.is_file()


def test_every_marker_found():
    found = {line.split(":", 2)[2] for line in lines() if line.count(":") >= 2}
    assert {e.split(":", 2)[2] for e in EXPECTED} <= found


def test_no_false_positives():
    assert len(lines()) == len(EXPECTED)
    assert not any("lowercase" in line or "tracker" in line for line in lines())


def test_exact_format_and_order():
    assert lines() == EXPECTED
