"""One widget per dashboard panel."""

from .anatomy import AnatomyPanel
from .candidates import CandidatesPanel
from .kv import KVPanel
from .lens import LensPanel
from .model import ModelPanel
from .output import OutputPanel
from .output_view import OutputView
from .pending import PendingPanel
from .prompt import PromptPanel
from .readings import ReadingsStrip
from .sampler import SamplerPanel
from .speed import SpeedPanel
from .status import StatusLine

__all__ = [
    "AnatomyPanel",
    "CandidatesPanel",
    "KVPanel",
    "LensPanel",
    "ModelPanel",
    "OutputPanel",
    "OutputView",
    "PendingPanel",
    "PromptPanel",
    "ReadingsStrip",
    "SamplerPanel",
    "SpeedPanel",
    "StatusLine",
]
