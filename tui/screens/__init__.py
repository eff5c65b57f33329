"""Modal screens: help, prompt editor, error dialog."""

from .error import ErrorDialog
from .help import HelpScreen
from .model_picker import ModelPicker
from .prompt_editor import PromptEditor

__all__ = ["ErrorDialog", "HelpScreen", "ModelPicker", "PromptEditor"]
