"""Strict, safe YAML loading that remembers where every key and value came from.

Only plain data comes out (mappings, lists, strings, numbers, booleans, null, dates).
Duplicate keys are errors at the duplicate; any tag outside YAML's plain types
(``!!python/object...``, ``!custom``) is refused before anything is constructed; syntax
errors keep their line and column. Every error reads ``FILE:LINE:COL: key.path: message``.
The way out: :func:`spec_yaml`, a model spec as a minimal experiment file.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from ..errors import format_loc

if TYPE_CHECKING:
    from ..model.specs import ModelSpec

Loc = tuple  # key path: str keys and int list indices

_T = "tag:yaml.org,2002:"
SCALAR_TAGS = {_T + t for t in ("null", "bool", "int", "float", "str", "timestamp")}
MAP_TAG, SEQ_TAG, MERGE_TAG = _T + "map", _T + "seq", _T + "merge"
MAX_NODES = 200_000  # guards against alias bombs ("billion laughs")
MAX_BYTES = 1 << 20  # 1 MiB: larger files are refused before parsing
MAX_DEPTH = 50  # nesting levels of mappings and lists
#: Control characters other than tab, newline and carriage return (C0, DEL, C1).
CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
#: what no decoded string may hold (escapes such as "\u001b" pass the raw-text check):
#: control characters, tab and line breaks included, and the bidirectional formatting
#: characters that make text read other than it is stored (a right-to-left override)
UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
#: the keys whose strings may span lines (a tab or a line break there is text)
MULTILINE = frozenset({"description"})


@dataclass(frozen=True)
class Position:
    """1-based line and column in the source text."""

    line: int
    col: int

    @classmethod
    def of(cls, mark: Any) -> Position:
        return cls(mark.line + 1, mark.column + 1)


class YamlError(ValueError):
    """The text is not acceptable YAML; ``messages`` are ``FILE:LINE:COL: ...`` lines."""

    def __init__(self, messages: Sequence[str]):
        self.messages = list(messages)
        super().__init__("\n".join(self.messages))


def show_tag(tag: str) -> str:
    return "!!" + tag[len(_T):] if tag.startswith(_T) else tag


@dataclass
class YamlDoc:
    """Plain data plus the position of each key and value, by key path."""

    data: Any
    filename: str = "<string>"
    keys: dict[Loc, Position] = field(default_factory=dict)
    values: dict[Loc, Position] = field(default_factory=dict)

    def get(self, loc: Sequence[object], default: Any = None) -> Any:
        """The data at ``loc`` or ``default``."""
        node = self.data
        for part in loc:
            if isinstance(node, Mapping) and part in node:
                node = node[part]
            elif isinstance(node, list) and isinstance(part, int) and -len(node) <= part < len(node):
                node = node[part]
            else:
                return default
        return node

    def clean(self, loc: Sequence[object]) -> Loc:
        """Drop parts of a validator's path that are not in the data (union tags and the
        like), keeping a missing last key so that 'field required' still names the field."""
        out: list = []
        node = self.data
        for i, part in enumerate(loc):
            if isinstance(node, Mapping) and part in node:
                node = node[part]
                out.append(part)
            elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
                node = node[part]
                out.append(part)
            elif i == len(loc) - 1 and isinstance(part, (str, int)):
                out.append(part)
        return tuple(out)

    def position(self, loc: Sequence[object], at: str = "auto") -> Position:
        """Where ``loc`` is written: its value when a scalar (``at="auto"``), else its key;
        the nearest written ancestor when ``loc`` itself is absent (a missing field)."""
        loc = tuple(loc)
        while loc:
            key, value = self.keys.get(loc), self.values.get(loc)
            if at == "key" and key:
                return key
            if at == "value" and value:
                return value
            scalar = not isinstance(self.get(loc), (Mapping, list))
            if value and (scalar or not key):
                return value
            found = key or value
            if found:
                return found
            loc = loc[:-1]
        return self.values.get((), Position(1, 1))

    def message(self, loc: Sequence[object], message: str, at: str = "auto") -> str:
        """``FILE:LINE:COL: key.path: message``."""
        pos = self.position(loc, at)
        return f"{self.filename}:{pos.line}:{pos.col}: {format_loc(tuple(loc))}: {message}"


class StrictLoader(yaml.SafeLoader):
    """A SafeLoader that composes nodes and builds plain data itself, recording positions.

    Composition only parses; no constructor runs for a tag it has not approved, so a
    ``!!python/object/apply`` tag is reported, never executed.
    """

    def __init__(self, stream: str, filename: str = "<string>") -> None:
        super().__init__(stream)
        self.filename = filename
        self.doc = YamlDoc(None, filename)
        self.errors: list[str] = []
        self._count = 0

    # -- entry point -----------------------------------------------------------------
    def load_doc(self) -> YamlDoc:
        try:
            node = self.get_single_node()
        except yaml.MarkedYAMLError as exc:
            raise YamlError([syntax_message(self.filename, exc)]) from None
        except yaml.YAMLError as exc:
            raise YamlError([f"{self.filename}:1:1: (top level): {exc}"]) from None
        finally:
            self.dispose()
        if node is not None:
            self.doc.values[()] = Position.of(node.start_mark)
            self.doc.data = self.plain(node, (), frozenset())
        if self.errors:
            raise YamlError(self.errors)
        return self.doc

    # -- node -> plain data ----------------------------------------------------------
    def fail(self, node: Node, loc: Loc, message: str) -> None:
        pos = Position.of(node.start_mark)
        self.errors.append(f"{self.filename}:{pos.line}:{pos.col}: {format_loc(loc)}: {message}")

    def plain(self, node: Node, loc: Loc, active: frozenset) -> Any:
        self._count += 1
        if self._count > MAX_NODES:
            raise YamlError([f"{self.filename}: the document expands to more than "
                             f"{MAX_NODES} values (aliases?); write it out plainly"])
        if id(node) in active:
            self.fail(node, loc, "an alias refers to its own ancestor; remove the recursion")
            return None
        if isinstance(node, ScalarNode):
            if node.tag not in SCALAR_TAGS:
                return self.refuse_tag(node, loc)
            try:
                value = self.construct_object(node, deep=True)
            except yaml.YAMLError as exc:
                self.fail(node, loc, f"cannot read this value: {getattr(exc, 'problem', exc)}")
                return None
            if isinstance(value, str):
                self.check_string(node, loc, value)
            return value
        active = active | {id(node)}
        if isinstance(node, SequenceNode):
            if node.tag != SEQ_TAG:
                return self.refuse_tag(node, loc)
            out = []
            for i, item in enumerate(node.value):
                self.doc.values.setdefault(loc + (i,), Position.of(item.start_mark))
                out.append(self.plain(item, loc + (i,), active))
            return out
        if node.tag != MAP_TAG:
            return self.refuse_tag(node, loc)
        return self.mapping(node, loc, active)

    def check_string(self, node: Node, loc: Loc, value: str) -> None:
        """Refuse a decoded string holding a character of :data:`UNSAFE` (a key's too)."""
        multiline = bool(loc) and loc[-1] in MULTILINE
        for found in UNSAFE.finditer(value):
            char = found.group()
            if multiline and char in "\t\n\r":
                continue
            what = ("a bidirectional formatting character: it makes text read other than it "
                    "is" if char >= "\u0600" else "a control character")
            self.fail(node, loc, f"{value[:40]!r} holds U+{ord(char):04X}, {what}; names, "
                                 "labels and values are plain text: remove it")
            return

    def refuse_tag(self, node: Node, loc: Loc) -> None:
        self.fail(
            node, loc,
            f"tag {show_tag(node.tag)} is not allowed; experiment files hold plain data only "
            "(mappings, lists, strings, numbers, booleans, null); remove the tag",
        )
        return None

    def mapping(self, node: MappingNode, loc: Loc, active: frozenset) -> dict:
        out: dict = {}
        first: dict[Any, Position] = {}
        merged: list[Node] = []
        for key_node, value_node in node.value:
            if key_node.tag == MERGE_TAG:
                merged.extend(value_node.value if isinstance(value_node, SequenceNode)
                              else [value_node])
                continue
            if not isinstance(key_node, ScalarNode) or key_node.tag not in SCALAR_TAGS:
                self.fail(key_node, loc, "keys must be plain strings or numbers")
                continue
            key = self.construct_object(key_node)
            if isinstance(key, str):
                self.check_string(key_node, loc + (key,), key)
            pos = Position.of(key_node.start_mark)
            if key in first:
                prev = first[key]
                self.fail(key_node, loc + (key,),
                          f"duplicate key {key!r} (first at line {prev.line}, column "
                          f"{prev.col}); keep one of them")
                continue
            first[key] = pos
            self.doc.keys.setdefault(loc + (key,), pos)
            self.doc.values.setdefault(loc + (key,), Position.of(value_node.start_mark))
            out[key] = self.plain(value_node, loc + (key,), active)
        for src in merged:  # explicit keys win over merged ones ("<<: *defaults")
            if not isinstance(src, MappingNode):
                self.fail(src, loc, "'<<' merges mappings only")
                continue
            for key, value in self.plain(src, loc, active).items():
                out.setdefault(key, value)
        return out


# YAML 1.1 reads ``1e-5`` (no dot) as a string; read it as the float everyone means.
StrictLoader.add_implicit_resolver(
    _T + "float", re.compile(r"^[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+$"), list("-+0123456789")
)


def syntax_message(filename: str, exc: yaml.MarkedYAMLError) -> str:
    mark = exc.problem_mark or exc.context_mark
    line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
    what = " ".join(p for p in (exc.context, exc.problem) if p) or str(exc)
    return f"{filename}:{line}:{col}: YAML syntax error: {what}"


def size_message(filename: str, n_bytes: int) -> str:
    """Why a file of ``n_bytes`` is refused before parsing."""
    return (f"{filename}: {n_bytes / 2**20:.1f} MiB ({n_bytes} bytes) is too large for an "
            f"experiment file (limit {MAX_BYTES // 2**20} MiB = {MAX_BYTES} bytes); "
            "is this the right file?")


def check_text(text: str, filename: str = "<string>") -> None:
    """Refuse, before parsing, text too large for an experiment or with control characters."""
    n_bytes = len(text.encode("utf-8", errors="surrogatepass"))
    if n_bytes > MAX_BYTES:
        raise YamlError([size_message(filename, n_bytes)])
    found = CONTROL.search(text)
    if found:
        line = text.count("\n", 0, found.start()) + 1
        col = found.start() - (text.rfind("\n", 0, found.start()) + 1) + 1
        count = len(CONTROL.findall(text))
        raise YamlError([
            f"{filename}:{line}:{col}: control character U+{ord(found.group()):04X} "
            f"({count} in the file); experiment files are plain text: only tab, newline and "
            "carriage return are allowed; remove it (a binary file or a bad copy-paste?)"
        ])


def check_depth(text: str, filename: str = "<string>") -> None:
    """Refuse mappings and lists nested deeper than :data:`MAX_DEPTH`, from the parser's
    events (not recursive, unlike composing), at the first one too deep."""
    depth = 0
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > MAX_DEPTH:
                    pos = Position.of(event.start_mark)
                    raise YamlError([f"{filename}:{pos.line}:{pos.col}: nested more than "
                                     f"{MAX_DEPTH} levels deep; an experiment needs a few "
                                     "levels: flatten it"])
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
    except yaml.MarkedYAMLError as exc:
        raise YamlError([syntax_message(filename, exc)]) from None
    except yaml.YAMLError as exc:
        raise YamlError([f"{filename}:1:1: (top level): {exc}"]) from None


def load_yaml(text: str, filename: str = "<string>") -> YamlDoc:
    """Parse ``text`` into plain data with positions; raises :class:`YamlError`.

    Refused before composing: more than :data:`MAX_BYTES`, control characters, nesting
    deeper than :data:`MAX_DEPTH`."""
    check_text(text, filename)
    check_depth(text, filename)
    return StrictLoader(text, filename).load_doc()


def read_text(path: str | Path) -> str:
    """A UTF-8 file's text, refused unread when larger than :data:`MAX_BYTES` (a pipe or
    device is read only that far); a :class:`YamlError` when missing or unreadable."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_BYTES + 1)
            if len(raw) > MAX_BYTES:
                size = path.stat().st_size if path.is_file() else len(raw)
                raise YamlError([size_message(str(path), size)])
        return raw.decode("utf-8")
    except FileNotFoundError:
        raise YamlError([f"{path}: no such file; check the path"]) from None
    except IsADirectoryError:
        raise YamlError([f"{path}: is a folder; give the experiment's .yaml file"]) from None
    except UnicodeDecodeError as exc:
        raise YamlError([f"{path}: not UTF-8 text (byte {exc.start}: {exc.reason}); "
                         "save it as UTF-8"]) from None
    except OSError as exc:
        raise YamlError([f"{path}: cannot read it: {exc.strerror or exc}"]) from None


def spec_yaml(spec: ModelSpec, name: str = "imported") -> str:
    """``spec`` as the ``model:`` of a minimal experiment YAML file (edit a slot, add
    ``variants``/``measure``, run it); the ``model`` mapping loads back to an equal spec."""
    doc = {"name": name, "seeds": [0], "model": spec.to_data()}
    return yaml.safe_dump(doc, sort_keys=False)
