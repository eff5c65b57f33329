"""tokentui's terminal dashboard (Textual). The engine lives in tokentui.core and never imports this package."""

from .app import TokentuiApp
from .program import run_dashboard
from .config import DashboardConfig

__all__ = ["DashboardConfig", "TokentuiApp", "run_dashboard"]
