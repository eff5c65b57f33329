"""`tokentui score` / `fanout --json` (tokentui/commands/stream.py) print every line through the one `json_line`:
text a server or a model supplies reaches the terminal escaped, C1 controls included."""

from __future__ import annotations

import argparse
import json

from fakes import FACTS
from tokentui.commands.stream import stream_run
from tokentui.core.runs.events import Notice


class _Engine:
    facts = FACTS

    def stop(self) -> None:
        pass


def test_json_lines_escape_c1_controls(capsys):
    args = argparse.Namespace(json=True, no_record=True, record_dir=None)
    hostile = "a\x9b31mb\x1b]0;x\x07c"  # a CSI as one C1 byte, and an OSC
    status = stream_run(args, _Engine(), lambda: iter([Notice(hostile)]), show=lambda e, emit: None, what="score")
    out = capsys.readouterr().out
    assert status == 0
    assert "\x9b" not in out and "\x1b" not in out and "\\u009b" in out
    notices = [json.loads(line) for line in out.splitlines() if '"notice"' in line]
    assert notices == [{"event": "notice", "message": hostile}]  # the same text, once parsed


def test_json_line_escapes_del_and_c1_alone_and_leaves_other_text_as_json_wrote_it():
    from tokentui.commands.common import json_line

    for text in ("\x7f", "tail \x9f", "\x80 head"):
        line = json_line(Notice(text))
        assert not any(0x7F <= ord(c) <= 0x9F for c in line) and json.loads(line)["message"] == text
    plain = {"event": "notice", "message": "naïve ␣ 中文 \u00a0 \t"}  # U+00A0 is past the C1 block: kept as is
    assert json_line(plain) == json.dumps(plain, ensure_ascii=False) + "\n"
