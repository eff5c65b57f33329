"""User-facing errors: one line that says what was wrong and what to do, never a traceback."""


class TokentuiError(Exception):
    """An error the user can act on. `str(err)` is the whole message, one line."""


class SettingsError(TokentuiError, ValueError):
    """A sampler / generation setting out of range."""


class ModelLoadError(TokentuiError):
    """The model named could not be found or loaded."""


class PromptError(TokentuiError):
    """The prompt cannot be run (empty, longer than the context, unreadable file)."""


class GenerationError(TokentuiError):
    """A run stopped because of a fault inside the engine (NaN logits, out of memory)."""
