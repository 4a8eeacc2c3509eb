"""A new revision's way in, pure: which groups to replace (`rollout_plan`, `surge`), the gates a group passes
before it counts as verified (`verification`, `bake`, `canary_gate` with the tool-call canary it judges), the
post-rollout `watch`, going back (`rollback`), and whether the pool's tool calls are safe from the DSML leak
(`toolcall_integrity`)."""
