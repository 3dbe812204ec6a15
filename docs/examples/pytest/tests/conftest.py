import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # mykernels

# normcheck's pytest plugin: the normcheck_case fixture, --normcheck-tier, --normcheck-fixtures.
pytest_plugins = ["normcheck.pytest_plugin"]
