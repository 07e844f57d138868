"""Reading hand-written spec files (cluster specs, job files) that may come from anyone: YAML or TOML.

A spec file is small and flat, so anything else is refused with a one-line error before it can cost time or
memory: files over :data:`MAX_SPEC_BYTES`, nesting deeper than :data:`MAX_DEPTH` (checked by a lexical scan
before the parser runs: PyYAML's scanner is quadratic in the depth of flow collections, and both parsers
recurse), YAML aliases (``*name``: an alias bomb expands a few lines into billions of nodes as soon as
anything walks or prints the result) and more than :data:`MAX_NODES` values. A key given twice in one
mapping is refused too (YAML requires unique keys; PyYAML would keep the last silently, TOML refuses it).
:func:`check_keys` refuses unknown keys with a "did you mean" hint, so a typo never silently falls back to a
default.
"""

from __future__ import annotations

import difflib
import functools
import os
import re
import stat
import sys
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from libarena.errors import ArenaError

#: far above any hand-written spec (the paper's 1,280-GPU cluster is under 1 KB; a sweep spec a few KB)
MAX_SPEC_BYTES = 1 << 20
MAX_DEPTH = 32
MAX_NODES = 100_000

_LEXEMES = re.compile(r"[\[\]{}'\"#\n\\]")


def _flow_depth_problem(text: str) -> str | None:
    """Where the brackets outside quotes and comments nest deeper than MAX_DEPTH (None: they do not)."""
    depth = 0
    quote = None
    comment = False
    escaped_at = -2
    line = 1
    for m in _LEXEMES.finditer(text):
        ch, pos = m.group(), m.start()
        if ch == "\n":
            line += 1
            comment = False
            continue
        if comment:
            continue
        if quote is not None:
            if ch == "\\" and quote == '"':
                escaped_at = pos
            elif ch == quote and escaped_at != pos - 1:
                quote = None
            continue
        if ch in "'\"":
            quote = ch
        elif ch == "#":
            comment = pos == 0 or text[pos - 1] in " \t\n"
        elif ch in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                return f"nested deeper than {MAX_DEPTH} levels (line {line})"
        elif ch in "]}":
            depth = max(0, depth - 1)
    return None


def _yaml_problem(text: str) -> str | None:
    """Aliases, depth and node count, from the parser's event stream (nothing is built yet)."""
    import yaml

    depth = nodes = 0
    try:
        for event in yaml.parse(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
            if isinstance(event, yaml.AliasEvent):
                line = event.start_mark.line + 1 if event.start_mark else "?"
                return f"YAML aliases (*{event.anchor}) are not accepted (line {line})"
            if isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
                depth += 1
                if depth > MAX_DEPTH:
                    line = event.start_mark.line + 1 if event.start_mark else "?"
                    return f"nested deeper than {MAX_DEPTH} levels (line {line})"
            elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
                depth -= 1
            if isinstance(event, (yaml.ScalarEvent, yaml.SequenceStartEvent, yaml.MappingStartEvent)):
                nodes += 1
                if nodes > MAX_NODES:
                    return f"more than {MAX_NODES} values"
    except yaml.YAMLError:
        return None  # the loader reports syntax errors with their position
    return None


def _depth_and_size(data: Any) -> tuple[int, int]:
    """(nesting depth, number of values) of parsed data, without recursion."""
    deepest = count = 0
    stack = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        count += 1
        deepest = max(deepest, depth)
        if count > MAX_NODES or deepest > MAX_DEPTH:
            break
        children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
        stack.extend((child, depth + 1) for child in children)
    return deepest, count


@functools.cache  # one class for every parse
def _yaml_loader() -> type:
    """PyYAML's safe loader (the C one where built) refusing a key given twice in one mapping."""
    import yaml

    from libarena.checks import brief

    base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

    class UniqueKeyLoader(base):  # type: ignore[misc, valid-type]
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen: set[Any] = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # ``<<: {...}``: merged keys may be overridden by the mapping's own, as YAML allows
                key = self.construct_object(key_node, deep=deep)
                try:
                    duplicate = key in seen
                except TypeError:  # an unhashable key: the base class says so
                    break
                if duplicate:
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping", node.start_mark, f"key {brief(key)} is given twice", key_node.start_mark)
                seen.add(key)
            return super().construct_mapping(node, deep=deep)

    return UniqueKeyLoader


def parse_spec_text(text: str, source: str, what: str, toml: bool = False) -> Any:
    """Parse the text of a spec file (YAML, or TOML when ``toml``) under the limits above."""
    problem = _flow_depth_problem(text)
    if problem is None and not toml:
        problem = _yaml_problem(text)
    if problem is not None:
        raise ArenaError(f"{source}: refused as a {what}: {problem}")
    if toml:
        try:
            data = tomllib.loads(text)
        except RecursionError:
            raise ArenaError(f"{source}: refused as a {what}: nested too deeply") from None
        except (tomllib.TOMLDecodeError, ValueError) as exc:  # ValueError: an integer of over 4,300 digits
            raise ArenaError(f"{source}: malformed {what} ({' '.join(str(exc).split())[:160]})") from None
    else:
        import yaml

        try:
            data = yaml.load(text, Loader=_yaml_loader())
        except RecursionError:
            raise ArenaError(f"{source}: refused as a {what}: nested too deeply") from None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            problem = getattr(exc, "problem", None) or " ".join(str(exc).split())[:160]
            raise ArenaError(f"{source}: malformed {what}: not valid YAML{where} ({problem})") from None
        except ValueError as exc:  # an integer of over 4,300 digits (Python's int-from-text limit)
            raise ArenaError(f"{source}: malformed {what} ({' '.join(str(exc).split())[:160]})") from None
    depth, count = _depth_and_size(data)
    if depth > MAX_DEPTH or count > MAX_NODES:
        raise ArenaError(f"{source}: refused as a {what}: nested deeper than {MAX_DEPTH} levels or more than "
                         f"{MAX_NODES} values")
    return data


def read_bounded(path: str | os.PathLike[str], limit: int, what: str, *, stdin: bool = False,
                 noun: str | None = None) -> bytes:
    """The bytes of an input file (``-``: stdin, where ``stdin``) of at most ``limit`` bytes, read without
    ever holding more: a missing file, a directory, a device (``/dev/zero`` never ends) or a larger input is a
    one-line ArenaError naming it as a ``what`` (say "trace"; the file: ``noun``, default "<what> file")."""
    size = f"{limit >> 20} MiB" if limit > 1 << 20 else f"{limit >> 10} KiB"
    a_what = f"{'an' if what[:1] in 'aeiou' else 'a'} {what}"
    if stdin and str(path) == "-":
        if sys.stdin is None:  # started with stdin closed (<&-)
            raise ArenaError(f"stdin is closed: expected {a_what}")
        data = sys.stdin.buffer.read(limit + 1)
        if not data:
            raise ArenaError(f"stdin is empty: expected {a_what}")
        if len(data) > limit:
            raise ArenaError(f"stdin: refused as {a_what}: larger than {size}")
        return data
    p = Path(path)
    noun = noun or (what if what.endswith(" file") else f"{what} file")
    try:
        info = p.stat()
    except (FileNotFoundError, NotADirectoryError):
        raise ArenaError(f"{p}: no such {noun}") from None
    except OSError as exc:
        raise ArenaError(f"{p}: cannot read the {what} ({exc.strerror or exc})") from None
    if stat.S_ISDIR(info.st_mode):
        raise ArenaError(f"{p}: is a directory, expected a {noun}")
    if not (stat.S_ISREG(info.st_mode) or stat.S_ISFIFO(info.st_mode)):
        raise ArenaError(f"{p}: is not a regular file or a pipe, expected a {noun}")
    if stat.S_ISREG(info.st_mode) and info.st_size > limit:
        raise ArenaError(f"{p}: refused as {a_what}: larger than {size}")
    try:
        with open(p, "rb") as f:
            data = f.read(limit + 1)
    except OSError as exc:
        raise ArenaError(f"{p}: cannot read the {what} ({exc.strerror or exc})") from None
    if len(data) > limit:
        raise ArenaError(f"{p}: refused as {a_what}: larger than {size}")
    return data


def load_spec_file(path: str | os.PathLike[str], what: str, *, stdin: bool = False) -> Any:
    """Read and parse a spec file (TOML when it ends in .toml, else YAML; ``-``: YAML from stdin, where
    ``stdin``), refusing what the module docstring lists; every problem is a one-line ArenaError naming it."""
    raw = read_bounded(path, MAX_SPEC_BYTES, what, stdin=stdin)
    source = "stdin" if stdin and str(path) == "-" else str(path)
    return parse_spec_bytes(raw, source, what, toml=source != "stdin" and is_toml(path))


def is_toml(path: str | os.PathLike[str]) -> bool:
    """Whether a spec file is read as TOML (by its suffix; YAML otherwise)."""
    return Path(path).suffix == ".toml"


def parse_spec_bytes(raw: bytes, source: str, what: str, toml: bool = False) -> Any:
    """Parse the bytes of a spec file read with :func:`read_bounded` (UTF-8 text, YAML or TOML)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ArenaError(f"{source}: malformed {what} (not UTF-8 text: byte {exc.start})") from None
    return parse_spec_text(text, source, what, toml=toml)


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest known word, or nothing."""
    close = difflib.get_close_matches(str(word), list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def check_keys(data: Mapping[Any, Any], known: Iterable[str], where: str) -> None:
    """Refuse keys of ``data`` outside ``known``, naming the first one, with a hint and the known keys."""
    known = list(known)
    unknown = [k for k in data if k not in known]
    if unknown:
        from libarena.checks import brief

        first = unknown[0]
        more = f" and {len(unknown) - 1} more" if len(unknown) > 1 else ""
        raise ArenaError(f"{where}: unknown key {brief(first)}{did_you_mean(str(first), known)}{more} "
                         f"(known: {', '.join(known)})")
