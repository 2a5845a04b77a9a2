"""Offline stand-in for the `requirements.bzl` of a rules_python pip hub.

Offline the compiler's Python dependencies come from the registered interpreter's
site-packages (the project's .venv), so there are no requirement targets.
"""

all_requirements = []

def requirement(name):
    fail("offline build: no pip hub; %s comes from the interpreter's site-packages" % name)
