"""docs/rules-reference.md is what rules_reference.py makes from the Starlark docstrings, and
those docstrings cover what they document: every macro argument in its `Args:`, every
public rule attribute and provider field with a doc. No Bazel needed: seconds."""
from __future__ import annotations

import inspect
import re

from rules_reference import REPO, Provider, Rule, _load_bzl, reference

PAGE = REPO / "docs" / "rules-reference.md"


def test_reference_page_is_up_to_date():
    assert PAGE.read_text() == reference(), (
        "docs/rules-reference.md is stale: .venv/bin/python tests/bazel/rules_reference.py > docs/rules-reference.md")


def _documented_args(doc: str) -> set[str]:
    """Names in a docstring's `Args:` section (`a, b, c: ...` counts all three)."""
    section = doc.split("Args:", 1)[1] if "Args:" in doc else ""
    names = set()
    for line in inspect.cleandoc(section).splitlines():
        m = re.match(r"^([*\w][\w, *]*):", line)
        if m:
            names.update(n.strip() for n in m.group(1).split(","))
    return names


def _public_api():
    cache: dict = {}
    defs = _load_bzl(REPO / "rules" / "defs.bzl", cache)
    setup = _load_bzl(REPO / "repositories.bzl", cache)
    return {k: v for ns in (defs, setup) for k, v in ns.items() if not k.startswith("_") and k != "load"}


def test_every_macro_argument_is_documented():
    missing = {}
    for name, fn in _public_api().items():
        if not inspect.isfunction(fn):
            continue
        params = {("**" + p.name) if p.kind == p.VAR_KEYWORD else p.name
                  for p in inspect.signature(fn).parameters.values()}
        undocumented = params - _documented_args(fn.__doc__ or "")
        if undocumented:
            missing[name] = sorted(undocumented)
    assert not missing, f"arguments missing from the docstrings' Args: {missing}"


def test_every_rule_attribute_and_provider_field_has_a_doc():
    api = _public_api()
    assert {"cuvil_model", "cuvil_binary", "cuvil_capture", "cuvil_compile", "cuvil_toolchain",
            "CuvilModelInfo", "cuvil_dependencies", "cuvil_register_toolchains"} <= set(api)
    empty = []
    for name, obj in api.items():
        if isinstance(obj, Rule):
            assert obj.doc, name
            empty += [f"{name}.{a}" for a, spec in obj.attrs.items() if not a.startswith("_") and not spec.doc]
        elif isinstance(obj, Provider):
            assert obj.doc, name
            empty += [f"{name}.{f}" for f, doc in obj.fields.items() if not doc]
    assert not empty, f"no doc: {empty}"
