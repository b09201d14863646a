"""`respd serve`'s settings: one flat model of every flag, one model per concern inside."""

from respd.config.engine import DEFAULT_MODEL_PACKAGE, alias_from_path, embedded_model_path
from respd.config.sampling import EMBEDDED_MODEL_SAMPLING
from respd.config.settings import Settings
from respd.config.store import default_data_dir

__all__ = [
    "DEFAULT_MODEL_PACKAGE",
    "EMBEDDED_MODEL_SAMPLING",
    "Settings",
    "alias_from_path",
    "default_data_dir",
    "embedded_model_path",
]
