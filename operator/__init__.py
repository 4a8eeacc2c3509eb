"""pdfleet operator: reconciles InferencePool resources into SGLang PD fleets."""
