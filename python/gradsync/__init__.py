"""gradsync for Python: libgradsync's engine (gradsync._engine) and its
errors; `gradsync.torch` is the PyTorch front end."""
from gradsync._engine import (  # noqa: F401
    Engine,
    Error,
    Interrupted,
    ModelMismatch,
    PeerLost,
    Timeout,
    WorldChanged,
)

__all__ = ["Engine", "Error", "Interrupted", "ModelMismatch", "PeerLost", "Timeout",
           "WorldChanged"]
