"""What copying to the clipboard can honestly say it did.

The dashboard copies with OSC 52 (Textual's `copy_to_clipboard`): an escape sequence the terminal may act on or
ignore, with no answer either way. Inside tmux the sequence reaches the outer terminal only when tmux's
`set-clipboard` option is `on` (its default, `external`, drops it from applications), so there the option is asked
for and the note says whether the copy could have got through.
"""

from __future__ import annotations

import os
import subprocess
from typing import Callable, Mapping


def tmux_set_clipboard() -> str | None:
    """tmux's `set-clipboard` option ("on", "external", "off"), None when it cannot be asked."""
    try:
        result = subprocess.run(["tmux", "show-options", "-gv", "set-clipboard"], capture_output=True, text=True,
                                timeout=1)
    except (OSError, subprocess.SubprocessError):
        return None
    value = result.stdout.strip()
    return value if result.returncode == 0 and value else None


def copy_note(name: str, env: Mapping[str, str] | None = None,
              tmux_option: Callable[[], str | None] = tmux_set_clipboard) -> tuple[str, str]:
    """(message, severity) after `name` was sent to the clipboard with OSC 52."""
    env = os.environ if env is None else env
    sent = f"{name} sent to the terminal's clipboard (OSC 52"
    if not env.get("TMUX"):
        return sent + "; a terminal that does not take it copies nothing)", "information"
    option = tmux_option()
    if option == "on":
        return sent + "; tmux's set-clipboard is on)", "information"
    said = f"is {option}" if option else "could not be read"
    return (f"{name} not copied: inside tmux the clipboard needs `tmux set -g set-clipboard on` (it {said}); "
            f"or select the path with the mouse", "warning")
