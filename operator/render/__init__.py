"""Pure functions from an InferencePool spec to the objects and command lines that realise it."""
