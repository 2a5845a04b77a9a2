"""Reading a config's YAML defensively: bounded in size, depth and alias expansion, and
refusing what a config never needs (Python or other non-standard tags, duplicate keys).

`compose_config(path)` reads the file (a regular file of at most MAX_BYTES), checks the
event stream (tags, nesting depth), composes the node graph (keeping each node's line
for messages), checks it (duplicate keys, recursive aliases, the size the aliases would
expand to) and only then constructs Python values from it. Every refusal is a
ConfigError of one line, `file:line: what`. libyaml's C parser is used where PyYAML
was built with it (`yaml.CSafeLoader`); the pure-Python one otherwise.
"""
from __future__ import annotations

from pathlib import Path

import yaml

from .errors import CuvilError, short
from .fsutil import read_regular

MAX_BYTES = 1 << 20      # a config file of more than 1 MiB is refused unread
MAX_DEPTH = 64           # nested mappings and sequences
MAX_EXPANDED = 200_000   # nodes plus scalar characters once every alias is expanded (or twice
                         # the text's length, if more)

_STANDARD = {f"tag:yaml.org,2002:{t}" for t in ("str", "int", "float", "bool", "null", "map", "seq",
                                                 "timestamp", "binary", "merge")}
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class ConfigError(CuvilError):
    """A config problem, with the key and file:line in the message."""


def _check_events(text: str, path: str) -> None:
    """Tags and depth, from the event stream (no tree built, no recursion)."""
    depth = 0
    try:
        for ev in yaml.parse(text, Loader=_Loader):
            line = ev.start_mark.line + 1
            tag = getattr(ev, "tag", None)
            if tag is not None and tag not in _STANDARD and tag != "!":
                raise ConfigError(f"{path}:{line}: the tag {short(tag)} is not allowed in a config "
                                  "(only plain YAML values)")
            if isinstance(ev, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                depth += 1
                if depth > MAX_DEPTH:
                    raise ConfigError(f"{path}:{line}: nested more than {MAX_DEPTH} levels deep")
            elif isinstance(ev, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                depth -= 1
    except yaml.YAMLError as e:
        raise _yaml_error(e, path) from None


def _yaml_error(e: yaml.YAMLError, path: str) -> ConfigError:
    mark = getattr(e, "problem_mark", None)
    where = f"{path}:{mark.line + 1}" if mark else path
    return ConfigError(f"{where}: not valid YAML: {getattr(e, 'problem', None) or short(str(e), 200)}")


def _children(node) -> list:
    if isinstance(node, yaml.MappingNode):
        return [n for kv in node.value for n in kv]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _check_mapping_keys(node, path: str) -> None:
    seen: dict = {}
    for k, _ in node.value:
        if not isinstance(k, yaml.ScalarNode):
            continue
        key = (k.tag, k.value)
        if key in seen and k.tag != "tag:yaml.org,2002:merge":
            raise ConfigError(f"{path}:{k.start_mark.line + 1}: duplicate key {short(k.value)} "
                              f"(first at line {seen[key]})")
        seen.setdefault(key, k.start_mark.line + 1)


def check_nodes(root, path: str, budget: int = MAX_EXPANDED) -> None:
    """Duplicate keys, recursive aliases and the expanded size (at most `budget`),
    walking the node graph (shared by aliases) once, without recursion."""
    size: dict[int, int] = {}     # id(node) -> expanded size, once known
    on_path: set[int] = set()
    stack = [(root, False)]
    while stack:
        node, done = stack.pop()
        nid = id(node)
        if done:
            on_path.discard(nid)
            total = 1 + (len(node.value) if isinstance(node, yaml.ScalarNode) else 0)
            total += sum(size[id(c)] for c in _children(node))
            if total > budget:
                raise ConfigError(f"{path}:{node.start_mark.line + 1}: YAML aliases expand this value to more "
                                  f"than {budget} nodes and characters")
            size[nid] = total
            continue
        if nid in size:
            continue
        if nid in on_path:
            raise ConfigError(f"{path}:{node.start_mark.line + 1}: a YAML alias refers to a value that contains it")
        if isinstance(node, yaml.MappingNode):
            _check_mapping_keys(node, path)
        on_path.add(nid)
        stack.append((node, True))
        stack.extend((c, False) for c in reversed(_children(node)) if id(c) not in size)


def compose_config(path: Path) -> tuple[object, object]:
    """(composed root node, constructed data) of the config file at `path`; (None, None)
    for an empty document."""
    data = read_regular(path, MAX_BYTES, "config file", ConfigError)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise ConfigError(f"{path}:{line}: not UTF-8 text") from None
    _check_events(text, str(path))
    try:
        root = yaml.compose(text, Loader=_Loader)
    except yaml.YAMLError as e:
        raise _yaml_error(e, str(path)) from None
    if root is None:
        return None, None
    # Without aliases a document expands to fewer nodes and characters than its text has
    # characters: only aliases can pass the budget.
    check_nodes(root, str(path), max(MAX_EXPANDED, 2 * len(text)))
    try:
        value = yaml.constructor.SafeConstructor().construct_document(root)
    except yaml.YAMLError as e:
        raise _yaml_error(e, str(path)) from None
    except (TypeError, ValueError) as e:  # an unhashable key, a bad timestamp, ...
        raise ConfigError(f"{path}:{root.start_mark.line + 1}: not a valid config value: {short(str(e), 200)}") \
            from None
    return root, value
