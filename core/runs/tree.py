"""The runs of one prompt as a tree, and the file that keeps it.

A tree is the first run of a prompt and every branch taken from it (core/runs/branch_point.py): each branch names
its parent, the step it left at and the token it took there instead of the parent's. The dashboard keeps one tree
per prompt (a restart or a new prompt starts another) and writes it as it grows, next to the runs' records:

    {"event": "tree", "version": 1, "prompt": "Is OpenAI open?", "system": null, "model": "SmolLM2-135M-Instruct"}
    {"event": "tree_run", "number": 1, "record": "20261201-101500-4242.jsonl"}
    {"event": "tree_run", "number": 2, "parent": 1, "at": 48, "token": 262, "piece": "␣the", "parent_token": 253,
     "parent_piece": "␣a", "record": "20261201-101500-4242-1.jsonl"}
    {"event": "tree_end", "number": 1, "reason": "stopped", "steps": 61, "superseded_by": 2}
    {"event": "tree_end", "number": 2, "reason": "eos", "steps": 40}

One JSON object a line, appended and flushed as each thing happens, so the file is whole after any crash (a last
line cut short is ignored by the reader; a run without a `tree_end` is one whose end its record tells, or that
was cut). A record is named by its file name alone, in the tree file's folder: a tree is outside input, and a name
with a folder in it (`../x.jsonl`, `/etc/passwd`), or one that resolves outside the folder through a symlink, or
names no file there, is refused with one line that reads the same whether or not what it names exists
(`record_refusal`). Each record stands alone (a branch's record carries its prompt and its prefix), so any of them
also replays by itself. `at` is the 0-based step index (the dashboard shows at + 1); `steps` counts the run's own
steps (a branch's: from its branch point on; the run's total from the prompt is at + steps). A forced phrase's
branch (or an adopted fan-out sample) also names every id it forced:
`"phrase": [262, 3458, 314]`, with `"phrase_text"` (what was typed) or `"sample"` (the sample's number).

A follow-up turn of a conversation (core/runs/turns.py) is a child of the run it follows, with its turn number and
its user message instead of a step and a token (its record's `turn` event holds the whole conversation):

    {"event": "tree_run", "number": 3, "parent": 1, "turn": 2, "user": "And Anthropic?", "record": "…-2.jsonl"}
"""

from __future__ import annotations

import json
from contextlib import suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterator

from ..errors import RecordError
from ..paths import open_private
from ..strict_json import loads as strict_loads
from .record_reader import json_lines
from .record_writer import JsonLinesFile
from .run import Run

TREE_VERSION = 1
TREE_SUFFIX = ".tree.jsonl"


@dataclass(frozen=True, slots=True)
class TreeNode:
    """One run of the tree: `number` 1 is the first run; a branch names its parent's number, the step index it left
    at and the token it took there (with the parent's own token at that step, when it had one)."""

    number: int
    parent: int | None = None
    at: int | None = None
    token: int | None = None
    piece: str = ""
    parent_token: int | None = None
    parent_piece: str | None = None
    record: str | None = None  # the run's record: a file name in the tree file's folder (None: not recorded)
    # a forced phrase (core/runs/branch_point.py): every id it forced from `at` on (`token` is the first), the text
    # typed, the fan-out sample adopted; written only where set
    phrase: tuple[int, ...] | None = None
    phrase_text: str | None = None
    sample: int | None = None
    # a follow-up turn (core/runs/turns.py): its turn number (2, 3, ...) and its user message; it names its parent
    # (the run it follows) but no step or token. Written only where set.
    turn: int | None = None
    user: str | None = None

    def __post_init__(self) -> None:
        if self.phrase is not None:
            if not isinstance(self.phrase, (list, tuple)) or not self.phrase or any(
                    isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in self.phrase):
                raise ValueError(f"a phrase is a list of token ids, got {self.phrase!r}")
            object.__setattr__(self, "phrase", tuple(self.phrase))
            if self.phrase[0] != self.token:
                raise ValueError("a phrase starts with the branch's token")
        if isinstance(self.number, bool) or not isinstance(self.number, int) or self.number < 1:
            raise ValueError(f"a run's number is an integer >= 1, got {self.number!r}")
        if self.turn is not None or self.user is not None:
            self._check_turn()
            return
        branch = (self.parent, self.at, self.token)
        if any(v is None for v in branch) and any(v is not None for v in branch):
            raise ValueError("a branch names its parent, its step and its token (a first run none of them)")
        if self.parent is not None:
            for name in ("parent", "at", "token"):
                value = getattr(self, name)
                if isinstance(value, bool) or not isinstance(value, int) or value < (1 if name == "parent" else 0):
                    raise ValueError(f"a branch's {name} must be an integer, got {value!r}")
            if self.parent >= self.number:
                raise ValueError(f"run {self.number} cannot branch from run {self.parent}, which came after it")
        if self.record is not None and not is_record_name(self.record):
            raise ValueError(record_refusal(self.number, self.record))

    def _check_turn(self) -> None:
        if isinstance(self.turn, bool) or not isinstance(self.turn, int) or self.turn < 2:
            raise ValueError(f"a follow-up's turn is an integer >= 2, got {self.turn!r}")
        if not isinstance(self.user, str):
            raise ValueError("a follow-up names its user message")
        if isinstance(self.parent, bool) or not isinstance(self.parent, int) or self.parent < 1:
            raise ValueError(f"a follow-up names the run it follows, got {self.parent!r}")
        if self.parent >= self.number:
            raise ValueError(f"run {self.number} cannot follow run {self.parent}, which came after it")
        if any(v is not None for v in (self.at, self.token, self.phrase, self.sample)):
            raise ValueError("a follow-up names no step, token or phrase")
        if self.record is not None and not is_record_name(self.record):
            raise ValueError(record_refusal(self.number, self.record))

    @property
    def is_branch(self) -> bool:
        return self.parent is not None and self.turn is None

    @property
    def is_turn(self) -> bool:
        """A follow-up turn of the run it follows (`parent`)."""
        return self.turn is not None

    def to_dict(self) -> dict:
        data = {"event": "tree_run", **{k: v for k, v in asdict(self).items() if v is not None and v != ""}}
        if self.phrase is not None:
            data["phrase"] = list(self.phrase)
        return data


@dataclass(frozen=True, slots=True)
class TreeEnd:
    """How a run of the tree ended: its `done` reason, its own steps, and the run that took over from it when a
    newer one stopped it (a branch started while it was going: it ended "stopped" by that branch, not by the user)."""

    number: int
    reason: str
    steps: int
    superseded_by: int | None = None

    def to_dict(self) -> dict:
        data = {"event": "tree_end", "number": self.number, "reason": self.reason, "steps": self.steps}
        if self.superseded_by is not None:
            data["superseded_by"] = self.superseded_by
        return data


@dataclass
class RunTree:
    """The tree's nodes in the order they were made, and how each ended; `runs` holds each run's Run once read (a
    tree read back from its file) or as the caller keeps it."""

    prompt: str = ""
    system: str | None = None
    model: str = ""
    nodes: list[TreeNode] = field(default_factory=list)
    ends: dict[int, TreeEnd] = field(default_factory=dict)
    runs: dict[int, Run] = field(default_factory=dict)
    path: Path | None = None  # the tree file, when it was read from one

    def __len__(self) -> int:
        return len(self.nodes)

    def node(self, number: int) -> TreeNode:
        if not 1 <= number <= len(self.nodes):
            raise KeyError(f"the tree has runs 1..{len(self.nodes)}, not {number}")
        return self.nodes[number - 1]

    def add(self, node: TreeNode) -> TreeNode:
        """The next run of the tree (its number must be the next one; a branch's parent must be in the tree)."""
        if node.number != len(self.nodes) + 1:
            raise ValueError(f"the next run of this tree is {len(self.nodes) + 1}, not {node.number}")
        if node.parent is not None and node.parent > len(self.nodes):
            raise ValueError(f"run {node.number}'s parent {node.parent} is not in the tree")
        self.nodes.append(node)
        return node

    def end(self, end: TreeEnd) -> None:
        self.node(end.number)
        self.ends[end.number] = end

    def children(self, number: int) -> list[TreeNode]:
        return [n for n in self.nodes if n.parent == number]

    # ---- the file ----------------------------------------------------------------------------------------
    def header(self) -> dict:
        return {"event": "tree", "version": TREE_VERSION, "prompt": self.prompt, "system": self.system,
                "model": self.model}

    @classmethod
    def read(cls, path: str | Path, *, with_runs: bool = True) -> "RunTree":
        """A tree file read back (and, `with_runs`, each run's record next to it: Run.from_record). RecordError,
        one line naming the file and the line, when it is not a tree this version can read or a record it names
        is not a file in its folder (`record_refusal`)."""
        path = Path(path)
        tree = cls(path=path)
        lines: dict[int, int] = {}  # each run's line, for what its record's check says
        for number, data in _tree_lines(path):
            where = f"{path}: line {number}"
            kind = data.get("event")
            try:
                if number == 1:
                    if kind != "tree":
                        raise ValueError("not a tokentui run tree (its first line is not the tree event)")
                    version = data.get("version")
                    if not isinstance(version, int) or version > TREE_VERSION:
                        raise ValueError(f"tree version {version!r}: from a newer tokentui")
                    tree.prompt = _text(data.get("prompt"), "prompt")
                    tree.system = _text(data.get("system"), "system", optional=True)
                    tree.model = _text(data.get("model", ""), "model")
                elif kind == "tree_run":
                    lines[tree.add(TreeNode(**_fields(data, TreeNode))).number] = number
                elif kind == "tree_end":
                    tree.end(TreeEnd(**_fields(data, TreeEnd)))
                else:
                    raise ValueError(f"unknown tree line {kind!r} (from a newer tokentui?)")
            except (TypeError, ValueError, KeyError) as err:
                raise RecordError(f"{where}: {err}") from None
        if not tree.nodes:
            raise RecordError(f"{path}: the tree has no run")
        if with_runs:
            for node in tree.nodes:
                if node.record is None:
                    continue
                record = record_in(path.parent, node.record)
                if record is None:
                    raise RecordError(f"{path}: line {lines[node.number]}: {record_refusal(node.number, node.record)}")
                tree.runs[node.number] = Run.from_record(record)
        return tree


def is_record_name(name) -> bool:
    """Whether a tree may name `name` as a record: a plain file name (no folder in it, not `.` or `..`, no NUL)."""
    return (isinstance(name, str) and name not in ("", ".", "..") and not any(c in name for c in "/\\\0"))


def record_refusal(number: int, name) -> str:
    """The one line for every record name a tree cannot use: the same text for a name with a folder in it, a
    symlink out of the folder and a file that is not there (so it tells nothing of what exists outside)."""
    shown = json.dumps(name, ensure_ascii=False) if isinstance(name, str) else type(name).__name__
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    return f"run {number}'s record {shown} is not a file in the tree's folder (a tree names each record by its " \
           "file name, beside the tree)"


def record_in(folder: Path, name: str) -> Path | None:
    """The file `name` is in `folder`, resolved (a symlink to a file in the same folder is followed); None when
    it is not a plain file name, or it resolves outside the folder, or no file is there."""
    if not is_record_name(name):
        return None
    try:
        home = folder.resolve()
        target = (folder / name).resolve()
        return target if target.parent == home and target.is_file() else None
    except (OSError, RuntimeError, ValueError):  # unreadable, a symlink loop, a name the system cannot take
        return None


def is_tree_file(path: str | Path) -> bool:
    """Whether `path` starts like a tree file (its first line the tree event), without reading the rest."""
    try:
        with open(path, "rb") as fh:
            first = fh.readline(64 * 1024)
    except OSError:
        return False
    try:
        data = strict_loads(first)
    except (UnicodeDecodeError, ValueError):
        return False
    return isinstance(data, dict) and data.get("event") == "tree"


def _tree_lines(path: Path) -> Iterator[tuple[int, dict]]:
    """A tree file's lines, read as a record's are (core/runs/record_reader.py json_lines: outside input, a line at a
    time, strict JSON); a last line cut short ends it."""
    for number, data in json_lines(path, "run tree"):
        if data is None:
            return
        if not isinstance(data, dict):
            raise RecordError(f"{path}: line {number} is not a JSON object")
        yield number, data


def _text(value, name: str, optional: bool = False):
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise ValueError(f"the tree's {name} should be text")
    return value


def _fields(data: dict, cls) -> dict:
    names = set(cls.__dataclass_fields__)
    return {k: v for k, v in data.items() if k in names}


class TreeWriter:
    """Appends a tree's lines to its file, each flushed as it is written (the file is private: 0600, as records
    are). Opened with the tree's header; `add` and `end` follow the tree as it grows. Never overwrites a file."""

    def __init__(self, path: Path, tree: RunTree) -> None:
        self.path = path
        # created, never replaced, readable by its owner alone (core/paths.py): it names what was asked and answered
        self._file = JsonLinesFile(open_private(path))
        try:
            self._file.write(tree.header())
        except OSError:  # a full disk: no file is left that nothing could be written to
            with suppress(OSError):
                self._file.close()
            with suppress(OSError):
                path.unlink()
            raise

    @classmethod
    def beside(cls, record: Path, tree: RunTree) -> "TreeWriter":
        """A tree file next to its first run's record, named after it (`<record>.tree.jsonl`... without the record's
        own `.jsonl`)."""
        stem = record.name.removesuffix(".jsonl")
        for n in range(1000):
            path = record.parent / f"{stem}{'-' + str(n) if n else ''}{TREE_SUFFIX}"
            try:
                return cls(path, tree)
            except FileExistsError:
                continue
        raise OSError(f"could not create a run tree file in {record.parent}")

    def add(self, node: TreeNode) -> None:
        self._file.write(node.to_dict())

    def end(self, end: TreeEnd) -> None:
        self._file.write(end.to_dict())

    def close(self) -> None:
        self._file.close()


def relative_record(tree_path: Path, record: Path | None) -> str | None:
    """How the tree file names a record: its file name, when it is in the tree file's folder (as the dashboard's
    records are: the tree is written beside the first); None (not named) elsewhere, since a tree names no other."""
    if record is None:
        return None
    try:
        same = record.parent.resolve() == tree_path.parent.resolve()
    except (OSError, RuntimeError):
        return None
    return record.name if same and is_record_name(record.name) else None
