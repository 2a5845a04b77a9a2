"""docs/rules-reference.md, made from the docstrings of Cuvil's Starlark: every public macro,
rule (with its attributes), provider (with its fields), build setting and WORKSPACE
set-up function. test_rules_reference.py checks that the committed page is what this
makes, so the reference cannot drift from `rules/`. Regenerate it with

    .venv/bin/python tests/bazel/rules_reference.py > docs/rules-reference.md

The .bzl files are read by executing them as Python with stand-ins for Bazel's
built-ins (`rule`, `attr`, `provider`, `load`, ...): Starlark's syntax is a subset of
Python's, and the stand-ins record what the files declare at load time.
"""
from __future__ import annotations

import inspect
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


class _Any:
    """Whatever a name Bazel defines (CcInfo, native, config, ...) is, at load time."""

    def __init__(self, name="?"):
        self._name = name

    def __getattr__(self, item):
        return _Any(f"{self._name}.{item}")

    def __call__(self, *args, **kwargs):
        return _Any(f"{self._name}()")

    def __repr__(self):
        return self._name


class Attr:
    def __init__(self, kind, **kwargs):
        self.kind = kind
        self.doc = kwargs.get("doc", "")
        self.mandatory = kwargs.get("mandatory", False)
        self.default = kwargs.get("default")
        self.values = kwargs.get("values")


class _AttrModule:
    def __getattr__(self, kind):
        return lambda **kwargs: Attr(kind, **kwargs)


class Rule:
    def __init__(self, implementation=None, doc="", attrs=None, **kwargs):
        self.doc = doc
        self.attrs = attrs or {}
        self.executable = kwargs.get("executable", False)


class Provider:
    def __init__(self, doc="", fields=None, **_):
        self.doc = doc
        self.fields = fields or {}


class BuildSetting:
    def __init__(self, name, build_setting_default, values=(), **_):
        self.name, self.default, self.values = name, build_setting_default, list(values)


def _label_path(label: str, here: Path) -> Path:
    """A .bzl label of this repository as a file."""
    if label.startswith(":"):
        return here.parent / label[1:]
    package, _, name = label.removeprefix("@cuvil").removeprefix("//").partition(":")
    return REPO / package / name


def _load_bzl(path: Path, cache: dict) -> dict:
    """The top-level names of a .bzl (or BUILD) file of this repository."""
    if path in cache:
        return cache[path]
    unknown: list[str] = []  # names of Bazel's that the stand-ins lack: _Any
    while True:
        namespace: dict = {}

        def load(label, *symbols, **aliases):
            if label.startswith("@") and not label.startswith("@cuvil//"):
                values = {s: _Any(s) for s in list(symbols) + list(aliases.values())}
            else:
                values = _load_bzl(_label_path(label, path), cache)
            for s in symbols:
                if s not in stand_ins:  # skylib's string_flag: the stand-in records it
                    namespace[s] = values[s]
            for alias, s in aliases.items():
                namespace[alias] = values[s]

        settings: list = []
        namespace.update({name: _Any(name) for name in unknown})
        stand_ins = dict(
            load=load,
            rule=Rule,
            repository_rule=Rule,
            provider=Provider,
            attr=_AttrModule(),
            Label=lambda s: s,
            transition=lambda **kwargs: _Any("transition"),
            struct=lambda **kwargs: _Any("struct"),
            fail=lambda *args: None,
            string_flag=lambda **kwargs: settings.append(BuildSetting(**kwargs)),
            config_setting=lambda **kwargs: None,
            package=lambda **kwargs: None,
        )
        namespace.update(stand_ins)
        builtin_names = set(namespace)
        try:
            exec(compile(path.read_text(), str(path), "exec"), namespace)
        except NameError as e:
            if e.name in unknown:
                raise
            unknown.append(e.name)
            continue
        names = {k: v for k, v in namespace.items() if k not in builtin_names and k != "__builtins__"}
        names["__settings__"] = settings
        cache[path] = names
        return names


def _paragraphs(text: str) -> str:
    return inspect.cleandoc(text or "").strip()


def _macro(name: str, fn) -> str:
    sig = str(inspect.signature(fn)).replace("'", '"')
    return f"### `{name}`\n\n```starlark\n{name}{sig}\n```\n\n```text\n{_paragraphs(fn.__doc__)}\n```\n"


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _rule(name: str, rule: Rule) -> str:
    rows = ["| attribute | type | mandatory | doc |", "|---|---|---|---|",
            "| `name` | name | yes | The target's name. |"]
    for attr_name, a in rule.attrs.items():
        if attr_name.startswith("_"):
            continue
        kind = a.kind + (f" ({', '.join(repr(v) for v in a.values)})" if a.values else "")
        rows.append(f"| `{attr_name}` | {_cell(kind)} | {'yes' if a.mandatory else 'no'} | {_cell(a.doc)} |")
    return f"### `{name}` (rule)\n\n{_cell(rule.doc)}\n\n" + "\n".join(rows) + "\n"


def _provider(name: str, p: Provider) -> str:
    rows = ["| field | doc |", "|---|---|"] + [f"| `{f}` | {_cell(d)} |" for f, d in p.fields.items()]
    return f"### `{name}` (provider)\n\n{_cell(p.doc)}\n\n" + "\n".join(rows) + "\n"


def reference() -> str:
    cache: dict = {}
    defs = _load_bzl(REPO / "rules" / "defs.bzl", cache)
    setup = _load_bzl(REPO / "repositories.bzl", cache)
    settings = _load_bzl(REPO / "cuvil" / "BUILD.bazel", cache).get("__settings__", [])
    api = {k: v for k, v in defs.items() if not k.startswith("_") and k != "load"}
    out = ["# Bazel rules reference",
           "",
           "Generated from the docstrings in `rules/`, `repositories.bzl` and `cuvil/BUILD.bazel`",
           "by `tests/bazel/rules_reference.py` (a test checks that this page is what it makes:",
           "edit the docstrings, then regenerate). Guide: [bazel.md](bazel.md).",
           "",
           '`load("@cuvil//rules:defs.bzl", ...)`:',
           "",
           "## Macros",
           ""]
    out += [_macro(k, v) for k, v in api.items() if inspect.isfunction(v)]
    out += ["## Rules", ""]
    out += [_rule(k, v) for k, v in api.items() if isinstance(v, Rule)]
    out += ["## Providers", ""]
    out += [_provider(k, v) for k, v in api.items() if isinstance(v, Provider)]
    out += ["## Constants", ""]
    out += [f"- `{k}` = `{v!r}`".replace("'", '"') for k, v in api.items() if isinstance(v, list)]
    out += ["", "## Build settings", "",
            "| flag (from your repository) | default | values | `select()` on |", "|---|---|---|---|"]
    out += [f"| `--@cuvil//cuvil:{s.name}` | `{s.default}` | {', '.join(f'`{v}`' for v in s.values)} | "
            f"`@cuvil//cuvil:{s.name}_<value>` |" for s in settings]
    out += ["", "## WORKSPACE set-up", "", '`load("@cuvil//:repositories.bzl", ...)`:', ""]
    out += [_macro(k, v) for k, v in setup.items()
            if inspect.isfunction(v) and not k.startswith("_") and k != "load"]
    return "\n".join(out).rstrip() + "\n"


if __name__ == "__main__":
    sys.stdout.write(reference())
