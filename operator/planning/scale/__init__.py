"""How many engine groups a role runs and where, pure: autoscaling from the engines' load, the prefill/decode
ratio band, InferencePoolRole scale targets, ordinals and which group a scale-down removes, gang waits."""
