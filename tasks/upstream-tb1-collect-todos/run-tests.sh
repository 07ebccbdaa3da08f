#!/bin/bash

# You can modify anything in this script. Just make sure it generates test output that
# is parsed by a parser (PytestParser by default).

# Terminal-Bench 1 installs curl and uv at this point and runs the tests with `uv run pytest` in a fresh uv
# project. Task containers here have no network, so the same pytest run uses the base image's interpreter
# and pytest (an absolute path, so nothing the agent put on PATH is picked up).

# Check if we're in a valid working directory
if [ "$PWD" = "/" ]; then
    echo "Error: No working directory set. Please set a WORKDIR in your Dockerfile before running this script."
    exit 1
fi

/usr/bin/python3 -m pytest $TEST_DIR/test_outputs.py -rA
