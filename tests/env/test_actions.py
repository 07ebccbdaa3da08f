"""Action conventions: JSON (H₀) and XML replies -> actions; malformed replies -> ActionError."""

import pytest

from rsi_jax.env.actions import Action, ActionError, parse_json_action, parse_xml_action


@pytest.mark.parametrize("text, want", [
    ('{"command": "ls -la", "done": false}', Action("ls -la", False)),
    ('Let me look.\n```json\n{"command": "cat a.txt"}\n```', Action("cat a.txt", False)),
    ('{"done": true}', Action(None, True)),
    ('{"command": "make", "done": true, "timeout": 5}', Action("make", True, 5.0)),
    ('{"analysis": "x {y}", "command": "echo \\"}\\""}', Action('echo "}"', False)),
    ('not json {oops} then {"command": "pwd"}', Action("pwd", False)),
    ('{"command": "   ", "done": true}', Action(None, True)),
])
def test_json_actions(text, want):
  assert parse_json_action(text) == want


@pytest.mark.parametrize("text, msg", [
    ("ls -la", "no JSON object"),
    ('{"command": "ls"', "no JSON object"),
    ('{"cmd": "ls"}', "unknown field"),
    ('{"command": 3}', "must be a string"),
    ('{"done": "yes"}', "true or false"),
    ('{"done": false}', "give a \\\"command\\\""),
    ('{"command": "ls", "timeout": -1}', "positive number"),
    ('[1, 2]', "no JSON object"),
])
def test_json_malformed(text, msg):
  with pytest.raises(ActionError) as e:
    parse_json_action(text)
  assert msg.replace("\\", "") in str(e.value)


@pytest.mark.parametrize("text, want", [
    ("<command>ls -la</command>", Action("ls -la", False)),
    ("I will check.\n<command>\ncat a | wc -l\n</command>", Action("cat a | wc -l", False)),
    ("<done/>", Action(None, True)),
    ("<command>make</command>\n<done>true</done>", Action("make", True)),
])
def test_xml_actions(text, want):
  assert parse_xml_action(text) == want


@pytest.mark.parametrize("text, msg", [
    ("ls -la", "no action found"),
    ("<command>ls", "unterminated"),
    ("<command>a</command><command>b</command>", "one <command>"),
    ('{"command": "ls"}', "no action found"),
])
def test_xml_malformed(text, msg):
  with pytest.raises(ActionError, match=msg):
    parse_xml_action(text)
