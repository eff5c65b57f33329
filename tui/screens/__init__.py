"""Modal screens: help, prompt editor, error dialog."""

from .error import ErrorDialog
from .help import HelpScreen
from .prompt_editor import PromptEditor

__all__ = ["ErrorDialog", "HelpScreen", "PromptEditor"]
