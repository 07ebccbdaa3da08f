#!/bin/bash
# Protected verifier, run after the agent has finished. The interpreter path is absolute and isolated (-I),
# PYTEST_ADDOPTS is dropped and plugin autoloading is off, so a pytest, python3, option or plugin planted by
# the agent cannot stand in for the real ones; the CTRF report plugin is loaded explicitly.
unset PYTEST_ADDOPTS
mkdir -p /logs/verifier
cd /tests || exit 1
PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 /usr/bin/python3 -I -m pytest -p ctrf.main -p no:cacheprovider \
  --ctrf /logs/verifier/ctrf.json -rA test_outputs.py
if [ $? -eq 0 ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
