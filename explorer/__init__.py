"""Inference Explorer: run a causal LM one forward pass at a time and see what each step does and costs."""

from explorer.loading import LoadedModel, ModelInfo, ModelNotFoundError, available_models, load
from explorer.sampling import Sampling
from explorer.trace import Step, Trace

__version__ = "0.1.0"

__all__ = ["LoadedModel", "ModelInfo", "ModelNotFoundError", "Sampling", "Step", "Trace",
           "available_models", "load", "__version__"]


def __getattr__(name: str):
    # Session / SpeculativeSession import lazily so `import explorer` stays light.
    if name == "Session":
        from explorer.engine import Session

        return Session
    if name == "SpeculativeSession":
        from explorer.speculative import SpeculativeSession

        return SpeculativeSession
    raise AttributeError(name)
